"""The scope-wide action inbox on two gateways: listing, paging, live announcements, isolation,
and the approvals service example as a process."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.e2e import cluster, harness
from tests.services import require_postgres, require_redis
from threadline_client import ActionsWatch, NotFound, ThreadlineClient, ThreadWatch, ToolCallPart
from threadline_wire.live_frames import ActionPendingFrame

pytestmark = [pytest.mark.postgres, pytest.mark.redis]
TIMEOUT = 30.0


@dataclass
class Setup:
    cluster: cluster.Cluster
    tokens: dict[str, str]

    def client(self, name: str, gateway: int = 0) -> ThreadlineClient:
        return ThreadlineClient(self.cluster.gateways[gateway].url, self.tokens[name])


@pytest.fixture(scope="module")
def setup() -> Iterator[Setup]:
    require_postgres()
    require_redis()
    with cluster.cluster(["gateway", "gateway", "worker"]) as running:
        tokens = running.tokens(
            {
                "alice": ("alpha", "user", "alice"),
                "svc": ("alpha", "backend", "svc"),
                "bot": ("alpha", "backend", "approvals-bot"),
                "carol": ("beta", "user", "carol"),
                "beta_svc": ("beta", "backend", "beta-svc"),
            }
        )
        yield Setup(running, tokens)


async def waiting_action(client: ThreadlineClient, text: str) -> tuple[str, str]:
    """A new thread whose run waits on one action; (thread id, action id)."""
    thread_id = (await client.create_thread("inbox")).thread.id
    await client.send(thread_id, text)
    watch: ThreadWatch
    async with client.watch(thread_id) as watch:
        await watch.until(
            lambda w: w.settled and w.snapshot is not None and bool(w.snapshot.pending_actions),
            TIMEOUT,
        )
    assert watch.snapshot is not None
    return thread_id, watch.snapshot.pending_actions[0].id


async def test_the_inbox_lists_pages_and_isolates_scopes(setup: Setup) -> None:
    async with setup.client("alice") as alice, setup.client("carol", 1) as carol:
        ours = [await waiting_action(alice, f"email a{i}@example.com hello") for i in range(3)]
        theirs = await waiting_action(carol, "email c@example.com hello")
    async with setup.client("svc", 1) as svc, setup.client("beta_svc") as beta:
        listed = [action async for action in svc.pending(page_size=1)]
        ids = {(a.thread_id, a.id) for a in listed}
        assert set(ours) <= ids and theirs not in ids
        assert all(a.scope == "alpha" and a.tool_name == "send_email" for a in listed)
        assert all(a.created_at and "approved" in a.payload_schema["properties"] for a in listed)
        assert len(listed) == len(ids)  # paging neither repeats nor skips
        assert theirs in {(a.thread_id, a.id) async for a in beta.pending()}
        assert not {(a.thread_id, a.id) async for a in beta.pending()} & set(ours)
        raw = await svc.http.get("/v1/actions", params={"status": "resolved"})
        assert raw.status_code == 422 and raw.json()["error"]["code"] == "invalid_input"


async def test_live_announcements_cross_gateways_and_never_another_scope(setup: Setup) -> None:
    svc_watch: ActionsWatch
    beta_watch: ActionsWatch
    async with (
        setup.client("svc") as svc,
        setup.client("beta_svc", 1) as beta,
        setup.client("alice", 1) as alice,
        svc.watch_actions() as svc_watch,
        beta.watch_actions() as beta_watch,
    ):
        await svc_watch.until(lambda w: w.syncs >= 1, TIMEOUT)
        await beta_watch.until(lambda w: w.syncs >= 1, TIMEOUT)
        assert svc_watch.scopes == ["alpha"] and beta_watch.scopes == ["beta"]
        before = set(beta_watch.actions)
        thread_id, action_id = await waiting_action(alice, "email live@example.com hi")
        await svc_watch.until(lambda w: action_id in w.actions, TIMEOUT)
        live = [e for e in list(svc_watch._events) if e.kind == "pending"]
        assert [e.data.id for e in live] == [action_id]  # announced live, not only refetched
        announced = live[0].frame
        assert isinstance(announced, ActionPendingFrame) and announced.thread_id == thread_id
        assert announced.action.id == action_id
        await alice.resume(action_id, {"approved": True}, thread_id=thread_id)
        await svc_watch.until(lambda w: action_id not in w.actions, TIMEOUT)
        assert any(e.kind == "resolved" and e.data == action_id for e in list(svc_watch._events))
        await asyncio.sleep(0.5)
        assert set(beta_watch.actions) == before
        frames = [e.frame for e in list(beta_watch._events) if e.frame is not None]
        assert all(getattr(f, "scope", None) == "beta" for f in frames), frames
    # Asking for a scope the token does not hold is not_found, as for threads.
    frame = await _subscribe_raw(setup, "beta_svc", "alpha")
    assert frame["type"] == "error" and frame["code"] == "not_found"
    assert (await _subscribe_raw(setup, "beta_svc", "beta"))["scopes"] == ["beta"]


async def _subscribe_raw(setup: Setup, token: str, scope: str) -> dict[str, object]:
    import orjson
    from websockets.asyncio.client import connect

    url = f"{setup.cluster.gateways[0].ws_url}?token={setup.tokens[token]}"
    async with connect(url) as ws:
        await ws.send(orjson.dumps({"type": "actions.subscribe", "scope": scope, "id": 1}))
        async with asyncio.timeout(TIMEOUT):
            return dict(orjson.loads(await ws.recv()))


async def test_the_approvals_service_resolves_each_action_exactly_once(setup: Setup) -> None:
    gateway = setup.cluster.gateways[0]
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREADLINE_")}
    env.update({"THREADLINE_URL": gateway.url, "THREADLINE_TOKEN": setup.tokens["bot"]})
    script = harness.ROOT / "examples" / "approvals_service.py"
    process = await asyncio.to_thread(
        subprocess.Popen,
        [sys.executable, str(script), "--allow-domain", "example.com"],
        env=env,
        cwd=harness.ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        async with setup.client("alice", 1) as alice:
            texts = ["email ok@example.com a", "email no@evil.test b", "email yes@example.com c"]
            threads = []
            for text in texts:
                thread_id = (await alice.create_thread("svc")).thread.id
                await alice.send(thread_id, text)
                threads.append(thread_id)
            finals = []
            for thread_id in threads:
                async with alice.watch(thread_id) as watch:
                    await watch.until(
                        lambda w: (
                            w.settled
                            and w.snapshot is not None
                            and w.snapshot.run is not None
                            and w.snapshot.run.status == "completed"
                        ),
                        TIMEOUT,
                    )
                assert watch.snapshot is not None
                finals.append(watch.snapshot)
    finally:
        process.terminate()
        output, _ = await asyncio.to_thread(process.communicate, timeout=15)
    decisions = []
    for final in finals:
        (part,) = [p for m in final.messages for p in m.parts if isinstance(p, ToolCallPart)]
        assert part.waiting is not None
        resolution = part.waiting.resolution
        assert resolution["subject"] == "approvals-bot", output
        decisions.append(resolution["payload"]["approved"])
    assert decisions == [True, False, True], output
    assert "I did not send the email" in finals[1].assistant_text()
    for thread_id in threads:  # each action resolved exactly once: one line per action
        assert sum(thread_id in line for line in output.splitlines()) == 1, output
    async with setup.client("svc") as svc:
        pending = {a.thread_id async for a in svc.pending()}
        assert not pending & set(threads)
        with pytest.raises(NotFound):
            await svc.snapshot("thr_missing")
