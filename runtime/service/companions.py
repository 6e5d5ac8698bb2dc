"""Services that ride beside a ThreadService (schedules and webhooks, the audit log), registered
by the app: the command table reaches each through the caller's service, so no transport needs
to know it exists, and a ThreadService without one (unit tests, the in-process runtime) says so."""

from __future__ import annotations

from typing import Generic, TypeVar
from weakref import WeakKeyDictionary

from runtime.service.thread_service import ThreadService

S = TypeVar("S")


class Companions(Generic[S]):
    """One companion of a kind per ThreadService; `missing` names the kind in the error."""

    def __init__(self, missing: str) -> None:
        self._missing = missing
        self._by_service: WeakKeyDictionary[ThreadService, S] = WeakKeyDictionary()

    def register(self, service: ThreadService, companion: S) -> None:
        self._by_service[service] = companion

    def of(self, service: ThreadService) -> S:
        companion = self._by_service.get(service)
        if companion is None:
            raise RuntimeError(f"{self._missing} not configured")
        return companion


__all__ = ["Companions"]
