"""The fan-out reference: a plain `websockets` + Redis pub/sub broadcaster, nothing else.

    python bench/reference.py --port PORT --redis URL --channel NAME [--deflate]
                              [--keepalive] [--loop uvloop|asyncio]

Every connection is a subscriber of CHANNEL; each message published on it is sent as is to every
connection with `websockets.broadcast` (framed and written per connection, no task wake-up per
connection). A client frame is answered with `{"type":"subscribed"}` so the benchmark's clients
are the same for Threadline and for this. `--keepalive`: the library's default keepalive (a ping
every 20 s, a 20 s pong deadline, as Threadline's gateway), for the idle-connection bench; the
fan-out benches leave it off. Prints "ready" once listening and subscribed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib

import redis.asyncio as redis
from websockets.asyncio.server import ServerConnection, broadcast, serve
from websockets.exceptions import ConnectionClosed

SUBSCRIBED = '{"type":"subscribed"}'


async def main(port: int, redis_url: str, channel: str, deflate: bool, keepalive: bool) -> None:
    clients: set[ServerConnection] = set()

    async def handler(websocket: ServerConnection) -> None:
        clients.add(websocket)
        try:
            # The benchmark's clients leave without a closing handshake: not an error here.
            with contextlib.suppress(ConnectionClosed):
                async for _ in websocket:
                    await websocket.send(SUBSCRIBED)
        finally:
            clients.discard(websocket)

    pubsub = redis.from_url(redis_url).pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(channel)
    async with serve(
        handler,
        "127.0.0.1",
        port,
        compression="deflate" if deflate else None,
        # websockets' own defaults when kept alive: a ping every 20 s, 20 s for the pong.
        ping_interval=20 if keepalive else None,
        max_size=2**16,
    ):
        print("ready", flush=True)
        async for message in pubsub.listen():
            if message["type"] == "message":
                broadcast(clients, message["data"].decode())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--redis", required=True)
    parser.add_argument("--channel", required=True)
    parser.add_argument("--deflate", action="store_true", help="accept permessage-deflate")
    parser.add_argument("--keepalive", action="store_true", help="the default 20 s pings")
    parser.add_argument(
        "--loop",
        choices=["uvloop", "asyncio"],
        default="uvloop",
        help="event loop (the gateway's: uvloop when installed)",
    )
    args = parser.parse_args()
    serving = main(args.port, args.redis, args.channel, args.deflate, args.keepalive)
    if args.loop == "uvloop":
        import uvloop

        uvloop.run(serving)
    else:
        asyncio.run(serving)
