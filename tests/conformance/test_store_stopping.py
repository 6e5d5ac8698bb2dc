"""Store conformance: a resume after a stop was requested is refused as `run_stopping`."""

from __future__ import annotations

import pytest

from runtime.domain import RunStatus
from runtime.errors import RunStopping
from runtime.storage.store import Store
from tests.conformance.store_helpers import SCOPES, new_thread, resolution, start_run, suspend


async def test_resume_of_a_stopping_run_is_refused_and_changes_nothing(store: Store) -> None:
    thread = await new_thread(store)
    admission, lease = await start_run(store, thread.id)
    assert admission.run_id is not None
    await suspend(store, lease, "act-1")
    stop = await store.request_stop(thread.id, SCOPES, admission.run_id)
    assert stop.status is RunStatus.WAITING  # flagged: its worker finalises the stop
    before = await store.snapshot(thread.id, SCOPES)
    with pytest.raises(RunStopping) as caught:
        await store.resolve_action(thread.id, SCOPES, "act-1", resolution())
    assert caught.value.code == "run_stopping"
    after = await store.snapshot(thread.id, SCOPES)
    assert after == before
