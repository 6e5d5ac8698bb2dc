"""The connection limit fits the process's descriptor limit."""

from __future__ import annotations

import resource

import pytest

from server.transports.uvicorn_http import RESERVED_DESCRIPTORS, connection_limit, http_protocol


def test_the_limit_is_lowered_to_what_the_descriptors_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 4096))
    assert connection_limit(10_000) == 1024 - RESERVED_DESCRIPTORS
    assert connection_limit(500) == 500


def test_an_unlimited_descriptor_limit_keeps_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    unlimited = resource.RLIM_INFINITY
    monkeypatch.setattr(resource, "getrlimit", lambda _: (unlimited, unlimited))
    assert connection_limit(10_000) == 10_000


def test_each_protocol_class_carries_its_own_deadline() -> None:
    short, long = http_protocol(1.5, 4.0), http_protocol(30.0, 90.0)
    assert (short.header_timeout, long.header_timeout) == (1.5, 30.0)
    assert (short.body_timeout, long.body_timeout) == (4.0, 90.0)
