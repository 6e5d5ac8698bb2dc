"""Which tokens a gateway's periodic recheck reads: all once, then only when a revocation
happened, or for connections opened since."""

from __future__ import annotations

from server.transports.ws.token_recheck import TokenRecheck


def test_tokens_found_live_are_not_read_again_while_nothing_is_revoked() -> None:
    check = TokenRecheck()
    assert check.to_read(3, {"a", "b"}) == {"a", "b"}
    check.found_live({"a", "b"})
    assert check.to_read(3, {"a", "b"}) == set()
    assert check.to_read(3, {"a", "b", "c"}) == {"c"}  # a connection opened since


def test_a_moved_count_reads_every_open_token_again() -> None:
    check = TokenRecheck()
    check.to_read(0, {"a", "b"})
    check.found_live({"a", "b"})
    assert check.to_read(1, {"a", "b"}) == {"a", "b"}
    check.found_live({"a"})  # b was the one revoked: its connections are closed
    assert check.to_read(1, {"a"}) == set()


def test_a_token_granted_before_a_revocation_and_opened_after_the_count_is_still_read() -> None:
    # The token is granted, then revoked (count 4 → 5), the count read as 5, and only then the
    # connection counted as open: it was never found live at 5, so it is read.
    check = TokenRecheck()
    check.to_read(4, {"a"})
    check.found_live({"a"})
    assert check.to_read(5, {"a"}) == {"a"}
    check.found_live({"a"})
    assert check.to_read(5, {"a", "late"}) == {"late"}


def test_a_failed_read_leaves_the_tokens_to_read_again() -> None:
    check = TokenRecheck()
    assert check.to_read(2, {"a"}) == {"a"}
    # The read failed (storage down): nothing was found live.
    assert check.to_read(2, {"a"}) == {"a"}


def test_closed_connections_tokens_are_forgotten() -> None:
    check = TokenRecheck()
    check.to_read(0, {"a"})
    check.found_live({"a"})
    assert check.to_read(0, set()) == set()
    # Reopened later with the same token: read again (it may have expired meanwhile).
    assert check.to_read(0, {"a"}) == {"a"}
