"""The websocket transport: accept, authenticate, then frames between socket and session."""
