"""Demo lifecycle: redacts e-mail addresses in assistant text, across chunk boundaries."""

from __future__ import annotations

import re
import string
from collections.abc import AsyncIterator
from typing import ClassVar

from runtime.lifecycle import AgentLifecycle, StepContext
from threadline_wire.chunks import StreamChunk, TextDeltaChunk

# No anchors, lookarounds or \b on purpose: a match then depends only on the characters it
# covers, which is what makes redacting run by run equal to redacting the whole text.
EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
REDACTED = "[redacted email]"
# Every character a match of EMAIL can contain: a match never crosses any other character.
ADDRESS_CHARS = frozenset(string.ascii_letters + string.digits + "._%+-@")


def redact(text: str) -> str:
    """Replace every address in a complete text."""
    return EMAIL.sub(REDACTED, text) if "@" in text else text


class EmailRedactor:
    """Sans-I/O streaming redactor: `feed` text pieces, then `flush` at a text boundary.

    It releases text up to the last character that cannot belong to an address and holds the
    trailing run of address characters, which a later piece may extend into an address. So
    the concatenated output equals `redact(whole text)`, and no piece of an address is ever
    released before it is known to be one. In ordinary text the held run is one word; it can
    grow to the longest run of address characters, which the step's text size bounds.
    """

    def __init__(self) -> None:
        self._held: list[str] = []

    @property
    def held(self) -> str:
        return "".join(self._held)

    def feed(self, text: str) -> str:
        """Redacted text that is safe to release now (possibly empty)."""
        # Scan only the new piece: rescanning the held run would make a long run quadratic.
        cut = len(text)
        while cut and text[cut - 1] in ADDRESS_CHARS:
            cut -= 1
        if cut == 0:
            if text:
                self._held.append(text)
            return ""
        ready = "".join(self._held) + text[:cut]
        self._held = [text[cut:]] if cut < len(text) else []
        return redact(ready)

    def flush(self) -> str:
        """Release the held run, redacted: the text ends here (stream end or a non-text chunk)."""
        ready = "".join(self._held)
        self._held = []
        return redact(ready)


class RedactEmails(AgentLifecycle):
    """Redacts e-mail addresses in the canonical step stream, so live clients, stored messages
    and later model steps never see them in assistant text. Non-text chunks pass through in
    order; held text is flushed before each of them, because text on either side of a tool
    call is stored as separate parts."""

    # The addresses it redacts, for agents that want to accept exactly those (as input patterns).
    pattern: ClassVar[re.Pattern[str]] = EMAIL

    async def transform_step_stream(
        self, ctx: StepContext, stream: AsyncIterator[StreamChunk]
    ) -> AsyncIterator[StreamChunk]:
        redactor = EmailRedactor()
        async for chunk in stream:
            if isinstance(chunk, TextDeltaChunk):
                ready = redactor.feed(chunk.delta)
                if ready:
                    yield TextDeltaChunk(delta=ready)
                continue
            held = redactor.flush()
            if held:
                yield TextDeltaChunk(delta=held)
            yield chunk
        held = redactor.flush()
        if held:
            yield TextDeltaChunk(delta=held)
