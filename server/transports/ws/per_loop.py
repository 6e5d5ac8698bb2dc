"""One object of a kind per event loop, made on first use and let go with the loop: what the
websocket transport shares between the connections of a loop (its keepalive wheel, its
deadlines), whichever server and app they belong to."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerLoop(Generic[T]):
    """`per_loop(loop)`: the loop's object, `make(loop)` the first time."""

    __slots__ = ("_by_loop", "_make")

    def __init__(self, make: Callable[[asyncio.AbstractEventLoop], T]) -> None:
        self._make = make
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = (
            weakref.WeakKeyDictionary()
        )

    def __call__(self, loop: asyncio.AbstractEventLoop) -> T:
        found = self._by_loop.get(loop)
        if found is None:
            self._by_loop[loop] = found = self._make(loop)
        return found
