"""Transports: HTTP, the websocket and SSE streams (AG-UI, AI SDK), over the command table."""
