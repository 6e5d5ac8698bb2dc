"""Tokens never reach a log line, in whatever encoding a client wrote them."""

from __future__ import annotations

import logging
import secrets
from urllib.parse import quote, unquote_plus

from hypothesis import given
from hypothesis import strategies as st

from server.logs import REDACTED, RedactTokens, redact

TOKEN = "tl_" + secrets.token_urlsafe(32)
# A mistyped or foreign token: redacted by its parameter's name, not by its shape.
OTHER = "x" + secrets.token_urlsafe(16)


def fully_decoded(text: str) -> str:
    for _ in range(6):
        text = unquote_plus(text)
    return text


def encode(text: str, escaped: list[bool], upper: list[bool]) -> str:
    """`text` with the characters `escaped` names as %XX and those `upper` names upper-cased."""
    out = []
    for char, esc, up in zip(text, escaped, upper, strict=False):
        char = char.upper() if up else char
        out.append(f"%{ord(char):02X}" if esc else char)
    return "".join(out) + text[len(out) :]


@given(
    key_escaped=st.lists(st.booleans(), min_size=5, max_size=5),
    key_upper=st.lists(st.booleans(), min_size=5, max_size=5),
    value_escaped=st.lists(st.booleans(), max_size=46),
    twice=st.booleans(),
    repeats=st.integers(min_value=1, max_value=3),
    separator=st.sampled_from(["&", ";"]),
    secret=st.sampled_from([TOKEN, OTHER]),
)
def test_a_token_parameter_is_redacted_in_every_encoding(
    key_escaped: list[bool],
    key_upper: list[bool],
    value_escaped: list[bool],
    twice: bool,
    repeats: int,
    separator: str,
    secret: str,
) -> None:
    key = encode("token", key_escaped, key_upper)
    value = encode(secret, value_escaped, [False] * len(secret))
    if twice:
        key, value = quote(key, safe=""), quote(value, safe="")
    query = separator.join(f"{key}={value}" for _ in range(repeats))
    line = f'127.0.0.1:5555 - "WebSocket /v1/ws?a=1&{query}" [accepted]'
    cleaned = redact(line)
    assert secret not in fully_decoded(cleaned)
    assert cleaned.count(REDACTED) == repeats
    assert "a=1" in cleaned


def test_a_token_outside_any_parameter_is_redacted() -> None:
    for text in (
        f"offered subprotocols threadline.v1, bearer.{TOKEN}",
        f'{{"token": "{TOKEN}"}}',
        f"GET /x/{quote(TOKEN, safe='')}",
        "".join(f"%{ord(c):02x}" for c in TOKEN),
    ):
        assert TOKEN not in fully_decoded(redact(text)), text


def test_other_parameters_and_text_are_left_alone() -> None:
    line = '"GET /v1/threads?limit=5&cursor=abc HTTP/1.1" 200 tokens_used=3 bottle_of_water'
    assert redact(line) == line


def test_the_filter_redacts_arguments_tracebacks_and_keeps_numbers() -> None:
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s" %d',
        ("127.0.0.1:1", "GET", f"/?TOKEN={TOKEN}", 200),
        None,
    )
    try:
        raise ValueError(f"bad {TOKEN}")
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
    assert RedactTokens().filter(record)
    assert record.getMessage() == f'127.0.0.1:1 - "GET /?TOKEN={REDACTED}" 200'
    assert TOKEN not in logging.Formatter().format(record)
