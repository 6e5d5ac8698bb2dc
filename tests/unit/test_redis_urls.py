"""Redis URLs: one server or a cluster, and the cluster form's seeds and credentials."""

from __future__ import annotations

import pytest

from realtime.redis_urls import check_redis_url, describe, is_cluster_url, parse_cluster_url


def test_a_cluster_url_names_its_seeds_and_credentials() -> None:
    address = parse_cluster_url("redis+cluster://app:s%40cret@10.0.0.1:7000,10.0.0.2:7001/0")
    assert address.seeds == (("10.0.0.1", 7000), ("10.0.0.2", 7001))
    assert (address.username, address.password, address.tls) == ("app", "s@cret", False)
    assert parse_cluster_url("rediss+cluster://h:6380").tls
    assert parse_cluster_url("redis+cluster://[::1]:7000").seeds == (("::1", 7000),)


@pytest.mark.parametrize(
    "url",
    [
        "redis+cluster://",
        "redis+cluster://host",
        "redis+cluster://host:port",
        "redis+cluster://host:70000",
        "redis+cluster://host:7000/3",
        "amqp://host:5672",
    ],
)
def test_malformed_urls_are_refused_with_a_clear_error(url: str) -> None:
    with pytest.raises(ValueError):
        check_redis_url(url)


def test_server_urls_pass_and_passwords_never_show() -> None:
    for url in ("redis://h:6379/0", "rediss://h", "unix:///run/redis.sock"):
        check_redis_url(url)
        assert not is_cluster_url(url)
    assert is_cluster_url("REDIS+CLUSTER://h:1")
    shown = describe("redis+cluster://app:secret@h1:7000,h2:7001")
    assert "secret" not in shown and "h2:7001" in shown
