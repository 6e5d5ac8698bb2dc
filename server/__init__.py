"""Threadline server: settings, app and lifespan, auth, HTTP routes, websocket gateway, CLI."""
