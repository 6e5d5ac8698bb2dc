"""A store that exposes only the `Store` interface of the backend it wraps, so the store suites
that run on it prove they need nothing else (no `pool`, no SQL, no private method)."""

from __future__ import annotations

import inspect
from types import TracebackType
from typing import Any, Protocol

from runtime.storage.store import Store


def interface_members(protocol: type) -> frozenset[str]:
    """The public methods `protocol` declares, its base protocols' included."""
    return frozenset(
        name
        for klass in protocol.__mro__
        if klass not in (object, Protocol) and getattr(klass, "_is_protocol", False)
        for name, member in vars(klass).items()
        if not name.startswith("_") and inspect.isfunction(member)
    )


STORE_MEMBERS = interface_members(Store)


class PublicStore:
    """Delegates exactly `STORE_MEMBERS` to `inner`; anything else is an `AttributeError`, as it
    would be on a backend that implements the interface and nothing more."""

    def __init__(self, inner: Store) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name not in STORE_MEMBERS:
            raise AttributeError(f"{name!r} is not part of the Store interface")
        return getattr(self._inner, name)

    async def __aenter__(self) -> PublicStore:
        await self._inner.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._inner.close()
