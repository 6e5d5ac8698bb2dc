"""The spec's execution loop: the worker, episodes, steps, tool calls, streaming and commits."""
