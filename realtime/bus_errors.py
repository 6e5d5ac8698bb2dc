"""Exceptions raised by the realtime buses."""

from __future__ import annotations


class BusError(Exception):
    """Base of bus failures. Publishing is best effort: callers log and count these."""


class BusClosedError(BusError):
    """The bus is not open (never opened, or already closed)."""


class BusUnavailableError(BusError):
    """The bus backend cannot be reached right now (for example Redis is down or restarting)."""
