"""Runnable examples: an agent module for THREADLINE_AGENT and a backend actor script."""
