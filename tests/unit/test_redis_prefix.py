"""THREADLINE_REDIS_PREFIX: the deployment's Redis namespace, under which the quota counters
live by default, and which a Redis Cluster's hash tags must survive."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from redis.crc import key_slot

from realtime.channels import presence_key, replay_key, thread_channel
from server.settings import Settings


def test_the_counters_live_under_the_deployment_prefix_unless_given_their_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("THREADLINE_REDIS_PREFIX", raising=False)
    monkeypatch.delenv("THREADLINE_LIMITS_PREFIX", raising=False)
    assert Settings().counters_prefix == "threadline:limits:"
    assert Settings(redis_prefix="staging:").counters_prefix == "staging:limits:"
    own = Settings(redis_prefix="staging:", limits_prefix="quotas:")
    assert own.counters_prefix == "quotas:"


@pytest.mark.parametrize("prefix", ["", "a{b:", "a}:", "two words:"])
def test_a_prefix_that_would_move_the_hash_tag_or_name_nothing_is_refused(prefix: str) -> None:
    with pytest.raises(ValidationError):
        Settings(redis_prefix=prefix)
    with pytest.raises(ValidationError):
        Settings(limits_prefix=prefix)


def test_a_threads_names_share_one_slot_under_any_accepted_prefix() -> None:
    for prefix in ("threadline:", "prod-eu:", "tenant.42/"):
        Settings(redis_prefix=prefix)
        names = [prefix + name("th_1") for name in (thread_channel, replay_key, presence_key)]
        assert len({key_slot(n.encode()) for n in names}) == 1
        assert key_slot(names[0].encode()) == key_slot(b"{th_1}")
