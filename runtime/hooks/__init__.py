"""Timers, schedules and webhooks at run time: the loops workers run, the service commands call."""
