"""Outbound safety for webhooks: which addresses a URL may reach, checked on every attempt."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from runtime.errors import InvalidInput

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# Cloud metadata services, refused even where an allow-list lets private ranges through
# unless it names them exactly.
METADATA = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200")
)


class RefusedUrl(InvalidInput):
    """A webhook URL that may not be posted to (`invalid_input` on the wire)."""


def parse_networks(text: str) -> tuple[Network, ...]:
    """`127.0.0.0/8, ::1` -> networks (the allow-list setting)."""
    return tuple(
        ipaddress.ip_network(item.strip(), strict=False) for item in text.split(",") if item.strip()
    )


def refusal(address: Address, allow: Sequence[Network]) -> str | None:
    """Why `address` is refused, or None when it may be reached."""
    if address in METADATA:
        # Only an allow-list entry naming the address itself lets it through: allowing a
        # private range must not open the credentials endpoint inside it.
        exact = any(n.num_addresses == 1 and address in n for n in allow)
        return None if exact else "a cloud metadata address"
    if any(address in network for network in allow):
        return None
    mapped = getattr(address, "ipv4_mapped", None)
    if mapped is not None:
        return refusal(mapped, allow)
    for name in ("loopback", "private", "link_local", "multicast", "reserved", "unspecified"):
        if getattr(address, f"is_{name}"):
            return f"a {name.replace('_', '-')} address"
    return None


@dataclass(frozen=True)
class Target:
    """A checked URL and the address it is posted to (the one checked: no second lookup a
    rebinding DNS answer could change)."""

    url: str
    host: str
    address: Address
    port: int
    scheme: str


def check_url_syntax(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RefusedUrl("a webhook URL is http:// or https:// with a host", field="url")
    if parts.username or parts.password:
        raise RefusedUrl("a webhook URL carries no credentials", field="url")
    if len(url) > 2000:
        raise RefusedUrl("a webhook URL has at most 2000 characters", field="url")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise RefusedUrl("a webhook URL's port is invalid", field="url") from exc
    return parts.scheme, parts.hostname, port


async def resolve(url: str, allow: Sequence[Network]) -> Target:
    """The address to post `url` to; `RefusedUrl` if any address its host resolves to is
    refused (a host with one public and one private address is refused as a whole)."""
    scheme, host, port = check_url_syntax(url)
    try:
        literal: Address | None = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        addresses = [literal]
    else:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM
            )
        except OSError as exc:
            raise RefusedUrl(f"host {host!r} does not resolve", field="url") from exc
        addresses = list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in infos))
    for address in addresses:
        reason = refusal(address, allow)
        if reason is not None:
            raise RefusedUrl(f"{host} resolves to {address}, {reason}", field="url")
    if not addresses:
        raise RefusedUrl(f"host {host!r} does not resolve", field="url")
    return Target(url=url, host=host, address=addresses[0], port=port, scheme=scheme)


__all__ = ["RefusedUrl", "Target", "check_url_syntax", "parse_networks", "refusal", "resolve"]
