"""SSE transports: a thread as an event stream, AG-UI and the AI SDK UI message stream."""
