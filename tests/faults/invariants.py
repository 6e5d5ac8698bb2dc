"""Invariants over a whole committed store, checked after every fault scenario."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import orjson

FINAL_TOOL_STATES = {"output-available", "output-error", "skipped", "rejected", "cancelled"}
TERMINAL_RUNS = {"completed", "failed", "cancelled"}
ACTIVE_RUNS = {"queued", "running", "waiting"}


@dataclass
class Observed:
    """What a scenario saw on the bus: invalidated versions and live chunks, per thread/run."""

    invalidations: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    # run id -> seq -> the chunk of that seq that counts: a redo after a takeover reuses seqs,
    # and a stale episode may still publish after it (it is void: see `current`).
    chunks: dict[str, dict[int, dict[str, Any]]] = field(default_factory=lambda: defaultdict(dict))
    # run id -> seq -> episode of the chunk kept in `chunks`.
    episodes: dict[str, dict[int, int]] = field(default_factory=lambda: defaultdict(dict))
    # run id -> (episode, seq) of its newest `run-takeover` chunk.
    takeovers: dict[str, tuple[int, int]] = field(default_factory=dict)
    # Chunks published by an episode after a newer one of its run had taken over.
    stale_after_takeover: int = 0

    def record(self, frame: dict[str, Any]) -> None:
        """Record one published frame (an invalidation or a chunk) of `frame["thread_id"]`."""
        if frame["type"] == "invalidate":
            self.invalidations[frame["thread_id"]].append(frame["version"])
            return
        if frame["type"] != "chunk":
            return
        run_id, seq, episode = frame["run_id"], int(frame["seq"]), int(frame.get("episode", 0))
        takeover = self.takeovers.get(run_id)
        if takeover is not None and episode < takeover[0]:
            self.stale_after_takeover += 1
            if seq >= takeover[1]:
                return  # void: the newer episode redoes this seq
        if frame["chunk"].get("type") == "run-takeover":
            self.takeovers[run_id] = (episode, seq)
        if episode >= self.episodes[run_id].get(seq, 0):
            self.chunks[run_id][seq] = frame["chunk"]
            self.episodes[run_id][seq] = episode


@dataclass
class Report:
    threads: int = 0
    runs: int = 0
    messages: int = 0
    violations: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"threads={self.threads} runs={self.runs} messages={self.messages}"
            f" violations={len(self.violations)}"
        )


async def check_store(dsn: str, observed: Observed | None = None) -> Report:
    """Every invariant over every thread of the database at `dsn`."""
    conn = await asyncpg.connect(dsn)
    try:
        threads = await conn.fetch("SELECT id, version FROM threads")
        messages = await conn.fetch(
            "SELECT id, thread_id, position, role, parts, run_id, client_request_id"
            " FROM messages ORDER BY thread_id, position"
        )
        runs = await conn.fetch(
            "SELECT id, thread_id, status, next_seq, created_version FROM runs"
            " ORDER BY thread_id, created_version"
        )
        queued = await conn.fetch("SELECT thread_id, client_request_id FROM queued_items")
    finally:
        await conn.close()
    report = Report(threads=len(threads), runs=len(runs), messages=len(messages))
    _check(report, threads, messages, runs, queued, observed)
    return report


def _check(
    report: Report,
    threads: Sequence[Mapping[str, Any]],
    messages: Sequence[Mapping[str, Any]],
    runs: Sequence[Mapping[str, Any]],
    queued: Sequence[Mapping[str, Any]],
    observed: Observed | None,
) -> None:
    bad = report.violations
    by_thread: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for message in messages:
        by_thread[message["thread_id"]].append(message)
    run_status = {run["id"]: run["status"] for run in runs}
    versions = {t["id"]: int(t["version"]) for t in threads}

    for thread_id, thread_messages in by_thread.items():
        positions = [int(m["position"]) for m in thread_messages]
        if positions != sorted(set(positions)):
            bad.append(f"{thread_id}: duplicate message positions {positions}")
        for index, message in enumerate(thread_messages):
            is_tail = index == len(thread_messages) - 1
            for part in orjson.loads(message["parts"]):
                if part.get("type") != "tool-call":
                    continue
                state = part.get("state")
                if state == "awaiting-action" and not is_tail:
                    bad.append(f"{thread_id}: pending action outside the tail ({message['id']})")
                if state not in FINAL_TOOL_STATES and run_status.get(message["run_id"]) in (
                    TERMINAL_RUNS
                ):
                    bad.append(
                        f"{thread_id}: open tool part {part.get('tool_call_id')} ({state})"
                        f" in terminal run {message['run_id']}"
                    )
        # Nothing duplicated: one input message per request id, one reply text per run step.
        requests = [m["client_request_id"] for m in thread_messages if m["client_request_id"]]
        if len(requests) != len(set(requests)):
            bad.append(f"{thread_id}: duplicated client_request_id among messages")
        bodies = [(m["run_id"], m["parts"]) for m in thread_messages if m["role"] == "assistant"]
        if len(bodies) != len(set(bodies)):
            bad.append(f"{thread_id}: the same assistant message was committed twice")

    active: dict[str, int] = defaultdict(int)
    created: dict[str, list[int]] = defaultdict(list)
    for run in runs:
        if run["status"] in ACTIVE_RUNS:
            active[run["thread_id"]] += 1
        created[run["thread_id"]].append(int(run["created_version"]))
    for thread_id, count in active.items():
        if count > 1:
            bad.append(f"{thread_id}: {count} active runs")
    for thread_id, created_versions in created.items():
        if len(created_versions) != len(set(created_versions)):
            bad.append(f"{thread_id}: two runs created at one version")
        if created_versions and max(created_versions) > versions.get(thread_id, 0):
            bad.append(f"{thread_id}: a run newer than its thread's version")

    requests_queued = [(q["thread_id"], q["client_request_id"]) for q in queued]
    keyed = [r for r in requests_queued if r[1]]
    if len(keyed) != len(set(keyed)):
        bad.append("a client_request_id was queued twice")

    if observed is None:
        return
    for thread_id, seen in observed.invalidations.items():
        final = versions.get(thread_id)
        if final is None:
            continue
        if final not in seen and final > 1:
            bad.append(f"{thread_id}: final version {final} was never invalidated ({seen[-5:]})")
        if any(v > final for v in seen):
            bad.append(f"{thread_id}: an invalidation names a version that was never committed")
    for run in runs:
        chunks = observed.chunks.get(run["id"])
        if not chunks or run["status"] not in TERMINAL_RUNS:
            continue
        # Every seq up to next_seq was published, and none beyond: the commits account for
        # every chunk the clients were shown.
        if sorted(chunks) != list(range(int(run["next_seq"]))):
            bad.append(
                f"run {run['id']}: next_seq {run['next_seq']} but seqs"
                f" {min(chunks)}..{max(chunks)} ({len(chunks)}) were streamed"
            )
        streamed = "".join(
            c.get("delta", "") for _, c in sorted(chunks.items()) if c.get("type") == "text-delta"
        )
        committed = "".join(
            part.get("text", "")
            for m in by_thread.get(run["thread_id"], [])
            if m["run_id"] == run["id"] and m["role"] == "assistant"
            for part in orjson.loads(m["parts"])
            if part.get("type") == "text"
        )
        if streamed != committed:
            bad.append(
                f"run {run['id']}: committed text ({len(committed)} chars) differs from the"
                f" streamed text ({len(streamed)} chars)"
            )
