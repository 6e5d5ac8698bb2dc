"""The hub's memory of the newest episode per run: bounded, least recently used run first."""

from __future__ import annotations

from realtime.envelopes import ChunkPosition
from realtime.hub import NewestEpisodes


def test_the_newest_episodes_are_bounded_by_recent_use() -> None:
    newest = NewestEpisodes(limit=2)
    assert not newest.superseded(ChunkPosition("a", 2, 0))
    assert not newest.superseded(ChunkPosition("b", 1, 0))
    assert newest.superseded(ChunkPosition("a", 1, 0))  # "a" is now the most recent
    assert not newest.superseded(ChunkPosition("c", 1, 0))  # evicts "b", not "a"
    assert len(newest) == 2
    assert newest.superseded(ChunkPosition("a", 1, 5))
    assert not newest.superseded(ChunkPosition("b", 0, 0))  # forgotten, so accepted
