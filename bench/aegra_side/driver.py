"""The careful LangGraph SDK client of bench/aegra.py, run in build/aegra-venv against an Aegra
server: per run, `client.threads.create()`, then `client.runs.stream(...)` of the scripted graph
(bench/aegra_side/graph.py) read to its end. The stream carries every token and ends with the
run, so a client needs nothing else to show the answer.

    python driver.py --url URL --runs N [--warmup 10] [--stream-mode messages-tuple[,values]]

Talks to bench/aegra.py over its pipes, so that process reads the server's CPU exactly around
the measured runs: after the warm-up it prints `ready` and waits for a line on stdin; after the
measured runs it prints one JSON line (wall seconds, first-token seconds per run, HTTP requests,
stream events, runs that streamed another number of text chunks than the model's) and waits
again; then it reads the last run back (`verified ...`) and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from langgraph_sdk import get_client

GRAPH = "scripted"


class Tally:
    def __init__(self) -> None:
        self.requests = 0
        self.events = 0
        self.odd_streams = 0  # runs that streamed another number of text chunks than sent
        self.first_token: list[float] = []


def text_of(event: str, data: Any) -> str:
    """The text an AI message chunk of a "messages" stream event carries ("" for others)."""
    if event.startswith("messages/partial") and isinstance(data, list) and data:
        message = data[-1]
    elif event.startswith("messages") and isinstance(data, list) and len(data) == 2:
        message = data[0]  # messages-tuple: (chunk, metadata)
    else:
        return ""
    if not isinstance(message, dict) or message.get("type") not in ("AIMessageChunk", "ai"):
        return ""
    content = message.get("content")
    return content if isinstance(content, str) else ""


async def run_once(client: Any, n: int, stream_mode: list[str], tokens: int, tally: Tally) -> str:
    thread = await client.threads.create()
    tally.requests += 1
    sent = time.perf_counter()
    first: float | None = None
    texts = 0
    tally.requests += 1
    async with asyncio.timeout(60):
        async for part in client.runs.stream(
            thread["thread_id"],
            GRAPH,
            input={"messages": [{"role": "user", "content": f"look it up {n}"}]},
            stream_mode=stream_mode,
        ):
            tally.events += 1
            if part.event == "error":
                raise RuntimeError(f"run failed: {part.data}")
            if text_of(part.event, part.data):
                texts += 1
                if first is None:
                    first = time.perf_counter() - sent
    if "messages-tuple" in stream_mode and texts != tokens:
        # Aegra 0.6 replays a run's stored events, then sends its live ones from the first
        # again: a stream that starts late (a loaded box) repeats tokens. Counted, not fatal.
        tally.odd_streams += 1
    tally.first_token.append(first if first is not None else float("nan"))
    return str(thread["thread_id"])


async def verify(client: Any, thread_id: str, tokens: int) -> str:
    """The last measured run's thread, read back once the CPU is read: the run succeeded, and
    its state holds what Threadline's holds (the message, the tool call, its answer, the text)."""
    runs = await client.runs.list(thread_id)
    state = await client.threads.get_state(thread_id)
    kinds = [m["type"] for m in state["values"]["messages"]]
    text = state["values"]["messages"][-1]["content"]
    expected = "".join(f"token{i} " for i in range(tokens))
    if [r["status"] for r in runs] != ["success"] or kinds != ["human", "ai", "tool", "ai"]:
        raise RuntimeError(f"unexpected run or state: {runs}, {kinds}")
    if text != expected:
        raise RuntimeError(f"unexpected answer: {text!r}")
    return f"verified {thread_id}: {' '.join(kinds)}, {len(text)} characters"


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--runs", type=int, required=True)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--stream-mode", default="messages-tuple", help="modes, comma-separated")
    parser.add_argument("--tokens", type=int, default=15)
    args = parser.parse_args()
    args.stream_mode = args.stream_mode.split(",")
    client = get_client(url=args.url, api_key=None)
    for n in range(args.warmup):  # imports, pools, caches
        await run_once(client, n, args.stream_mode, args.tokens, Tally())
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    tally = Tally()
    started = time.perf_counter()
    threads = [
        await run_once(client, n, args.stream_mode, args.tokens, tally) for n in range(args.runs)
    ]
    wall = time.perf_counter() - started
    result = {
        "wall": wall,
        "first_token": tally.first_token,
        "requests": tally.requests,
        "events": tally.events,
        "odd_streams": tally.odd_streams,
    }
    print(json.dumps(result), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    print(await verify(client, threads[-1], args.tokens), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
