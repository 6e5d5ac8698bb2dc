"""Which Redis a URL names: one server (redis://, rediss://, unix://) or a cluster (+cluster)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster

SERVER_SCHEMES = frozenset({"redis", "rediss", "unix"})
# redis+cluster://[user:password@]host:port[,host:port...] names a Redis Cluster by some of
# its nodes (seeds); the client learns every other node from them. rediss+cluster uses TLS.
CLUSTER_SCHEMES = frozenset({"redis+cluster", "rediss+cluster"})


@dataclass(frozen=True)
class ClusterAddress:
    """A parsed cluster URL: seed nodes and credentials."""

    seeds: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = None
    tls: bool = False


def scheme_of(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else ""


def is_cluster_url(url: str) -> bool:
    return scheme_of(url) in CLUSTER_SCHEMES


def check_redis_url(url: str) -> None:
    """ValueError naming the accepted forms when `url` is neither a server nor a cluster."""
    scheme = scheme_of(url)
    if scheme in CLUSTER_SCHEMES:
        parse_cluster_url(url)
    elif scheme not in SERVER_SCHEMES:
        raise ValueError(
            f"unsupported bus URL scheme {scheme!r}; expected redis://, rediss:// or"
            " redis+cluster://host:port[,host:port...]"
        )


def _seed(text: str, url: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"cluster URL {url.split('@')[-1]!r}: {text!r} is not host:port")
    return host.strip("[]"), int(port)


def parse_cluster_url(url: str) -> ClusterAddress:
    """The seeds and credentials of a `redis+cluster://` URL; ValueError when malformed."""
    scheme = scheme_of(url)
    if scheme not in CLUSTER_SCHEMES:
        raise ValueError(f"not a cluster URL (scheme {scheme!r})")
    rest = url.split("://", 1)[1]
    netloc, _, path = rest.partition("/")
    if path.split("?")[0] not in ("", "0"):
        raise ValueError("a Redis Cluster has only database 0; drop the /<db> from the URL")
    userinfo, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    seeds = tuple(_seed(part, url) for part in hosts.split(",") if part)
    if not seeds:
        raise ValueError("a cluster URL names at least one host:port")
    return ClusterAddress(seeds, username, password, tls=scheme == "rediss+cluster")


def cluster_client(address: ClusterAddress, **options: Any) -> RedisCluster:
    """A redis-py cluster client on `address` (not yet initialised: the first command does)."""
    from redis.asyncio.cluster import ClusterNode, RedisCluster

    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in address.seeds],
        username=address.username,
        password=address.password,
        ssl=address.tls,
        **options,
    )


def command_client(url: str, **options: Any) -> Redis | RedisCluster:
    """A client for plain commands and scripts on the Redis or cluster `url` names."""
    if is_cluster_url(url):
        return cluster_client(parse_cluster_url(url), **options)
    from redis.asyncio import Redis

    return Redis.from_url(url, **options)


async def initialize(client: Redis | RedisCluster) -> None:
    """Load a cluster client's slot map before its first use (no-op for one server).

    redis-py loads it lazily on the first command, and commands that raced that load can find
    their connection closed under them ('NoneType' object has no attribute 'writelines') when
    the seed nodes are swapped for the discovered ones.
    """
    from redis.asyncio.cluster import RedisCluster

    if isinstance(client, RedisCluster):
        await client.initialize()


def describe(url: str) -> str:
    """`url` without its password, for messages and logs."""
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    userinfo, _, hosts = rest.rpartition("@")
    user = urlsplit(f"x://{userinfo}@h").username or ""
    return f"{scheme}://{user}:***@{hosts}"
