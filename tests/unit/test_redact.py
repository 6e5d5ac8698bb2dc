"""E-mail redaction across chunk boundaries: equal to whole-text redaction, never leaks a piece."""

from __future__ import annotations

import asyncio
import itertools
import string
from collections.abc import AsyncIterator

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.demo.redact import (
    ADDRESS_CHARS,
    EMAIL,
    REDACTED,
    EmailRedactor,
    RedactEmails,
    redact,
)
from runtime.domain import RunTrigger
from runtime.lifecycle import RunContext, StepContext
from threadline_wire.chunks import StepFinishChunk, StreamChunk, TextDeltaChunk, ToolCallChunk

# --- strategies ---------------------------------------------------------------------------------

_local = st.text(string.ascii_letters + string.digits + "._%+-", min_size=1, max_size=12)
_label = st.text(string.ascii_lowercase + string.digits + "-", min_size=1, max_size=8)
_tld = st.text(string.ascii_lowercase, min_size=2, max_size=4)
addresses = st.builds(
    lambda local, labels, tld: f"{local}@{'.'.join(labels)}.{tld}",
    _local,
    st.lists(_label, min_size=1, max_size=3),
    _tld,
)
words = st.text(string.ascii_letters + string.digits, min_size=1, max_size=8)
separators = st.sampled_from([" ", ", ", ". ", ".", "\n", "!", "(", ")", ": ", "é", "—", "\t"])
# Almost-addresses: stray '@', missing top-level domain, trailing dots and doubled '@'.
near_misses = st.sampled_from(["@", "a@b", "x@y.z", "foo@", "@bar.com", "a@b.c@d.com", "..@"])
tokens = st.one_of(words, separators, addresses, near_misses, addresses)
texts = st.lists(tokens, min_size=0, max_size=25).map("".join)


@st.composite
def chunked_texts(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A text and a random split of it into consecutive (possibly empty) chunks."""
    text = draw(texts)
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=12)))
    bounds = [0, *cuts, len(text)]
    return text, [text[a:b] for a, b in itertools.pairwise(bounds)]


def feed_all(chunks: list[str]) -> list[str]:
    redactor = EmailRedactor()
    out = [redactor.feed(c) for c in chunks]
    out.append(redactor.flush())
    return [piece for piece in out if piece]


# --- the pure redactor ---------------------------------------------------------------------------


@settings(max_examples=400)
@given(chunked_texts())
def test_output_equals_whole_text_redaction(case: tuple[str, list[str]]) -> None:
    text, chunks = case
    out = feed_all(chunks)
    assert "".join(out) == EMAIL.sub(REDACTED, text)
    addresses_in_text = [m.group() for m in EMAIL.finditer(text)]
    for piece in out:
        assert EMAIL.search(piece) is None
        for address in addresses_in_text:
            assert address not in piece


@settings(max_examples=400)
@given(chunked_texts())
def test_nothing_is_released_before_it_is_known_safe(case: tuple[str, list[str]]) -> None:
    """After every chunk, the text released so far is a prefix of the whole redacted text. The
    redacted text holds no character of any address, so no piece of one was ever released, not
    even a piece later proven to start an address."""
    text, chunks = case
    expected = redact(text)
    redactor = EmailRedactor()
    released = ""
    consumed = ""
    for chunk in chunks:
        released += redactor.feed(chunk)
        consumed += chunk
        assert expected.startswith(released)
        # Only what could still become part of an address is held back.
        held = redactor.held
        assert consumed.endswith(held)
        assert set(held) <= ADDRESS_CHARS
        if consumed and consumed[-1] not in ADDRESS_CHARS:
            assert held == ""
    released += redactor.flush()
    assert released == expected
    assert redactor.held == ""


@given(addresses, st.integers(1, 4))
def test_an_address_streamed_character_by_character_never_appears(address: str, size: int) -> None:
    text = f"Done: I sent the email to {address}."
    chunks = [text[i : i + size] for i in range(0, len(text), size)]
    out = feed_all(chunks)
    assert "".join(out) == f"Done: I sent the email to {REDACTED}."
    assert not any("@" in piece for piece in out)


def test_examples() -> None:
    assert redact("mail bob@example.com.") == f"mail {REDACTED}."
    assert redact("a@b.c@d.com") == f"a@{REDACTED}"
    assert redact("no address here @ all") == "no address here @ all"
    assert redact("x@y.z") == "x@y.z"  # one-letter top-level domain: not an address
    assert feed_all(["write to bo", "b@exa", "mple.org now"]) == [
        "write to ",
        f"{REDACTED} ",
        "now",
    ]


def test_a_long_run_of_address_characters_is_held_not_rescanned() -> None:
    redactor = EmailRedactor()
    for _ in range(2_000):
        assert redactor.feed("abcde") == ""
    assert redactor.feed("@example.com ") == f"{REDACTED} "
    assert redactor.held == ""


# --- the lifecycle over a chunk stream ----------------------------------------------------------


def step_context() -> StepContext:
    run = RunContext(
        thread_id="t",
        scope="s",
        run_id="r",
        episode=1,
        started_by="u",
        trigger=RunTrigger.MESSAGE,
        resumed=False,
        state={},
        thread_metadata={},
    )
    return StepContext(run=run, step=0, local={})


async def _transform(chunks: list[StreamChunk]) -> list[StreamChunk]:
    async def source() -> AsyncIterator[StreamChunk]:
        for chunk in chunks:
            await asyncio.sleep(0)
            yield chunk

    return [c async for c in RedactEmails().transform_step_stream(step_context(), source())]


def _segments(chunks: list[StreamChunk]) -> list[str | StreamChunk]:
    """Texts between non-text chunks, and the non-text chunks, in order."""
    out: list[str | StreamChunk] = [""]
    for chunk in chunks:
        if isinstance(chunk, TextDeltaChunk):
            if not isinstance(out[-1], str):
                out.append("")
            out[-1] = str(out[-1]) + chunk.delta
        else:
            out.append(chunk)
    return [item for item in out if item != ""]


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(chunked_texts(), st.just(None)), max_size=6))
def test_lifecycle_redacts_text_between_non_text_chunks(
    parts: list[tuple[str, list[str]] | None],
) -> None:
    stream: list[StreamChunk] = []
    expected: list[str | StreamChunk] = []
    for n, part in enumerate(parts):
        if part is None:
            marker = ToolCallChunk(tool_call_id=f"c{n}", name="t", input={"n": n})
            stream.append(marker)
            expected.append(marker)
        else:
            text, pieces = part
            stream.extend(TextDeltaChunk(delta=p) for p in pieces)
            if text:
                if expected and isinstance(expected[-1], str):
                    expected[-1] += text
                else:
                    expected.append(text)
    expected = [redact(x) if isinstance(x, str) else x for x in expected]
    out = asyncio.run(_transform(stream))
    # Text next to text from the original stream is one text; compare after the same folding.
    assert _segments(out) == [x for x in expected if x != ""]
    for chunk in out:
        if isinstance(chunk, TextDeltaChunk):
            assert chunk.delta
            assert EMAIL.search(chunk.delta) is None


async def test_lifecycle_flushes_held_text_before_a_non_text_chunk_and_at_the_end() -> None:
    finish = StepFinishChunk(step=0, finish_reason="stop")
    out = await _transform(
        [
            TextDeltaChunk(delta="mail al"),
            TextDeltaChunk(delta="ice@ex"),
            finish,
            TextDeltaChunk(delta="ample.com"),
        ]
    )
    # The tool boundary ends the first text: "alice@ex" alone is no address, and "ample.com"
    # alone is not one either.
    assert out == [
        TextDeltaChunk(delta="mail "),
        TextDeltaChunk(delta="alice@ex"),
        finish,
        TextDeltaChunk(delta="ample.com"),
    ]
    out = await _transform(
        [TextDeltaChunk(delta="Done: I sent the email to bo"), TextDeltaChunk(delta="b@x.io.")]
    )
    assert out == [
        TextDeltaChunk(delta="Done: I sent the email to "),
        TextDeltaChunk(delta=f"{REDACTED}."),
    ]
