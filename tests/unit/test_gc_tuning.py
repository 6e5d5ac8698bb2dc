"""server/gc_tuning.py: the freeze, the threshold and the collection log, in this process."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.gc_tuning import parse_gc_log, tune_gc
from server.settings import Settings


@pytest.fixture
def restored_gc() -> Iterator[None]:
    threshold, callbacks = gc.get_threshold(), list(gc.callbacks)
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
        gc.callbacks[:] = callbacks


def test_parse_counts_each_generation_inside_the_window_only() -> None:
    text = "9.5 2 1000000\n10.0 0 2000\n10.5 0 3000\n11.0 2 250000000\n12.0 1 1\n10.7 1"
    assert parse_gc_log(text, 10.0, 12.0) == {0: (2, 5000), 2: (1, 250_000_000)}
    assert parse_gc_log("", 0.0, 1.0) == {}


@pytest.mark.usefixtures("restored_gc")
def test_tune_freezes_sets_the_threshold_and_logs_collections(tmp_path: Path) -> None:
    path = tmp_path / "gc.log"
    log = tune_gc(Settings(gc_threshold=5000, gc_log=str(path)))
    assert log is not None
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold()[0] == 5000
    gc.collect(1)
    log.close()
    assert log not in gc.callbacks
    generations = [int(line.split()[1]) for line in path.read_text().splitlines()]
    assert generations == [2, 1]  # the collection before the freeze, then ours


@pytest.mark.usefixtures("restored_gc")
def test_tune_changes_nothing_when_switched_off() -> None:
    threshold = gc.get_threshold()
    assert tune_gc(Settings(gc_freeze=False, gc_threshold=None)) is None
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == threshold
