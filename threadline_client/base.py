"""`async with` support shared by the client and its watches (this package stands alone: it
imports nothing of the server's packages)."""

from __future__ import annotations

import abc
from types import TracebackType
from typing import Self


class AsyncClosing(abc.ABC):
    """`async with obj:` runs `_enter()` and gives `obj`; leaving the block awaits `aclose()`."""

    def _enter(self) -> None:
        """What entering the block starts (nothing unless a subclass says so)."""
        return None

    @abc.abstractmethod
    async def aclose(self) -> None: ...

    async def __aenter__(self) -> Self:
        self._enter()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
