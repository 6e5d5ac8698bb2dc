"""Campaign clients: seeded random operations with random timing against both gateways."""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.campaign.history import History, Op
from tests.campaign.sessions import Session
from tests.campaign.streams import agui_body, aisdk_body, read_stream
from tests.e2e.run_inputs import agui_input

OP_TIMEOUT = 4.0  # past this an operation's outcome is unknown
CONNECT_ATTEMPTS = 60
KINDS = (
    ("send", 34),
    ("resume", 20),
    ("stop", 8),
    ("stop_resume", 5),
    ("regenerate", 7),
    ("retry", 7),
    ("hide", 4),
    ("cancel", 5),
    ("agui", 6),
    ("aisdk", 6),
    ("aisdk_join", 3),
    ("reconnect", 6),
    ("resubscribe", 6),
    ("create", 4),
    ("join", 6),
)


@dataclass(frozen=True)
class Step:
    """One planned operation: drawn from the client's RNG before the run, so a seed replays
    the same plan whatever the answers are."""

    pause: float
    kind: str
    email: bool
    long: bool  # a reply that streams for about a second: faults land mid-stream
    keyed: bool
    resend: bool  # an at-least-once client: a keyed send sent again even after its answer
    approve: bool
    racers: int
    pick: float


def plan(rng: random.Random, steps: int) -> list[Step]:
    names, weights = zip(*KINDS, strict=True)
    return [
        Step(
            pause=rng.expovariate(1 / 0.4),
            kind=rng.choices(names, weights)[0],
            email=rng.random() < 0.3,
            long=rng.random() < 0.25,
            keyed=rng.random() < 0.6,
            resend=rng.random() < 0.15,
            approve=rng.random() < 0.5,
            racers=rng.randint(1, 3),
            pick=rng.random(),
        )
        for _ in range(steps)
    ]


@dataclass
class Client:
    """One user on one gateway, following one thread (it may create or join another)."""

    name: str
    subject: str
    tokens: dict[str, str]  # subject -> token, for racing resolvers
    gateways: Callable[[], list[tuple[str, str]]]  # (http url, ws url) of each gateway
    home: int
    threads: list[str]
    thread_id: str
    history: History
    steps: list[Step]
    session: Session | None = None
    sessions: list[Session] = field(default_factory=list)
    sent: int = 0

    @property
    def token(self) -> str:
        return self.tokens[self.subject]

    def _url(self, offset: int = 0) -> str:
        urls = self.gateways()
        return urls[(self.home + offset) % len(urls)][0]

    async def connect(self) -> bool:
        """A new websocket session (the old one closed), retried while gateways restart. A
        client that cannot connect for CONNECT_ATTEMPTS (a loaded box, a long outage) records
        a failed `connect` and goes on without a session: the next step tries again."""
        await self.close_session()
        problem = ""
        for attempt in range(CONNECT_ATTEMPTS):
            http_url, ws_url = self.gateways()[(self.home + attempt) % len(self.gateways())]
            session = Session(http_url, ws_url, self.token, f"{self.name}/ws{len(self.sessions)}")
            try:
                await session.__aenter__()
                await session.subscribe(self.thread_id)
            except Exception as exc:
                problem = repr(exc)[:300]
                await session.__aexit__(None, None, None)
                await asyncio.sleep(0.5)
                continue
            self.sessions.append(session)
            self.session = session
            return True
        op = self.history.invoke(self.name, "connect", self.thread_id)
        History.complete(op, "fail", None, problem)
        return False

    async def close_session(self) -> None:
        if self.session is not None:
            await self.session.__aexit__(None, None, None)
            self.session = None

    async def run(self, deadline: float) -> None:
        async with httpx.AsyncClient(timeout=OP_TIMEOUT) as http:
            for step in self.steps:
                if time.monotonic() >= deadline:
                    return
                await asyncio.sleep(step.pause)
                if self.session is None or self.session.broken:
                    await self.connect()
                await getattr(self, f"_{step.kind}")(http, step)

    # --- operations ----------------------------------------------------------------------

    async def call(
        self, http: httpx.AsyncClient, op: Op, method: str, path: str, token: str, body: Any
    ) -> httpx.Response | None:
        headers = {"Authorization": f"Bearer {token}"}
        try:
            # Alternate gateways: a thread's commands arrive through both.
            url = self._url(op.index % 2) + path
            response = await http.request(method, url, json=body, headers=headers)
        except httpx.ConnectError as exc:  # nothing reached a server
            History.complete(op, "fail", None, repr(exc))
            return None
        except httpx.HTTPError as exc:
            History.complete(op, "unknown", None, repr(exc))
            return None
        body_json: Any = None
        with contextlib.suppress(ValueError):
            body_json = response.json()
        if response.status_code < 300:
            outcome = "ok"
        elif response.status_code < 500:
            outcome = "fail"
        else:  # 503 after retries: a cut COMMIT may still have committed
            outcome = "unknown"
        History.complete(op, outcome, response.status_code, body_json)  # type: ignore[arg-type]
        return response

    async def snapshot(self, http: httpx.AsyncClient) -> dict[str, Any] | None:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            response = await http.get(
                f"{self._url()}/v1/threads/{self.thread_id}",
                headers={"Authorization": f"Bearer {self.token}"},
            )
            if response.status_code == 200:
                return dict(response.json())
        return None

    async def _send(self, http: httpx.AsyncClient, step: Step) -> None:
        marker, text = self._message(step, keyed=step.keyed)
        body: dict[str, Any] = {"text": text}
        if step.keyed:
            body["client_request_id"] = marker
        path = f"/v1/threads/{self.thread_id}/messages"
        op = self.history.invoke(self.name, "send", self.thread_id, marker=marker, keyed=step.keyed)
        await self.call(http, op, "POST", path, self.token, body)
        if step.keyed and (op.outcome == "unknown" or step.resend):  # same request id
            again = self.history.invoke(self.name, "send_retry", self.thread_id, marker=marker)
            await self.call(http, again, "POST", path, self.token, body)

    async def _agui(self, http: httpx.AsyncClient, step: Step) -> None:
        """A send through AG-UI (its message id is the request id), its stream read to the end;
        unkeyed: a join (the thread's messages again, nothing new), which sends nothing."""
        purpose = "send" if step.keyed else "join"
        stream = self.history.stream(self.name, "ag-ui", self.thread_id, purpose)
        url = f"{self._url(len(self.history.streams) % 2)}/v1/ag-ui"
        if not step.keyed:
            body = agui_input(self.thread_id)
            await read_stream(http, self.history, None, stream, "POST", url, self.token, body)
            return
        marker, text = self._message(step)
        op = self.history.invoke(self.name, "send", self.thread_id, marker=marker, keyed=True)
        op.args["transport"] = "ag-ui"
        body = agui_body(self.thread_id, marker, text)
        await read_stream(http, self.history, op, stream, "POST", url, self.token, body)

    async def _aisdk(self, http: httpx.AsyncClient, step: Step) -> None:
        """A send through the AI SDK chat route (policy `reject`: 409 while a run is active)."""
        stream = self.history.stream(self.name, "ai-sdk", self.thread_id, "send")
        url = f"{self._url(len(self.history.streams) % 2)}/v1/ai-sdk/chat"
        marker, text = self._message(step)
        op = self.history.invoke(self.name, "send", self.thread_id, marker=marker, keyed=True)
        op.args["transport"] = "ai-sdk"
        body = aisdk_body(self.thread_id, marker, text)
        await read_stream(http, self.history, op, stream, "POST", url, self.token, body)

    async def _aisdk_join(self, http: httpx.AsyncClient, step: Step) -> None:
        """`resumeStream()`: the run in flight from its beginning (204 when there is none)."""
        stream = self.history.stream(self.name, "ai-sdk", self.thread_id, "join")
        url = f"{self._url(len(self.history.streams) % 2)}/v1/ai-sdk/chat/{self.thread_id}/stream"
        await read_stream(http, self.history, None, stream, "GET", url, self.token, None)

    def _message(self, step: Step, *, keyed: bool = True) -> tuple[str, str]:
        """The send's marker and text; an unkeyed send's text begins "unkeyed", so that the
        nemesis can aim a cut COMMIT at one (nemesis.UNKEYED_SEND_TEXT)."""
        self.sent += 1
        marker = f"m-{self.name}-{self.sent}"
        text = f"email {marker}@example.com now" if step.email else f"note {marker}"
        if not keyed:
            text = f"unkeyed {text}"
        if step.long:
            text += " " + " ".join(f"word{i:02d}" for i in range(40))
        return marker, text

    async def _resume(self, http: httpx.AsyncClient, step: Step) -> None:
        snapshot = await self.snapshot(http)
        actions = (snapshot or {}).get("pending_actions") or []
        if not actions:
            return
        action = actions[int(step.pick * len(actions))]
        subjects = sorted(self.tokens)
        start = subjects.index(self.subject)
        racers = [subjects[(start + i) % len(subjects)] for i in range(step.racers)]
        path = f"/v1/threads/{self.thread_id}/actions/{action['id']}/resume"

        async def one(subject: str, approve: bool) -> None:
            op = self.history.invoke(
                self.name,
                "resume",
                self.thread_id,
                action_id=action["id"],
                run_id=action["run_id"],
                subject=subject,
            )
            body = {"payload": {"approved": approve}}
            await self.call(http, op, "POST", path, self.tokens[subject], body)

        await asyncio.gather(
            *(one(s, step.approve if i == 0 else not step.approve) for i, s in enumerate(racers))
        )

    async def _stop_resume(self, http: httpx.AsyncClient, step: Step) -> None:
        """A person presses stop, then answers the action the page still shows: the answer
        must be refused (the stop cancels the action), never 200."""
        snapshot = await self.snapshot(http)
        actions = (snapshot or {}).get("pending_actions") or []
        if not actions:
            return
        action = actions[int(step.pick * len(actions))]
        run_id = action["run_id"]
        op = self.history.invoke(self.name, "stop", self.thread_id, run_id=run_id)
        path = f"/v1/threads/{self.thread_id}"
        await self.call(http, op, "POST", f"{path}/runs/{run_id}/stop", self.token, {})
        op = self.history.invoke(
            self.name,
            "resume",
            self.thread_id,
            action_id=action["id"],
            run_id=run_id,
            subject=self.subject,
        )
        body = {"payload": {"approved": step.approve}}
        await self.call(http, op, "POST", f"{path}/actions/{action['id']}/resume", self.token, body)

    async def _stop(self, http: httpx.AsyncClient, step: Step) -> None:
        run = ((await self.snapshot(http)) or {}).get("run")
        if not run or run["status"] not in ("queued", "running", "waiting"):
            return
        op = self.history.invoke(self.name, "stop", self.thread_id, run_id=run["id"])
        await self.call(
            http, op, "POST", f"/v1/threads/{self.thread_id}/runs/{run['id']}/stop", self.token, {}
        )

    async def _regenerate(self, http: httpx.AsyncClient, step: Step) -> None:
        op = self.history.invoke(self.name, "regenerate", self.thread_id)
        await self.call(
            http, op, "POST", f"/v1/threads/{self.thread_id}/regenerate", self.token, {}
        )

    async def _retry(self, http: httpx.AsyncClient, step: Step) -> None:
        run = ((await self.snapshot(http)) or {}).get("run")
        if not run or run["status"] not in ("failed", "cancelled"):
            return
        op = self.history.invoke(self.name, "retry", self.thread_id, run_id=run["id"])
        path = f"/v1/threads/{self.thread_id}/runs/{run['id']}/retry"
        await self.call(http, op, "POST", path, self.token, {})

    async def _hide(self, http: httpx.AsyncClient, step: Step) -> None:
        """Hide a message of the thread (or show it again): hiding is no deletion."""
        messages = ((await self.snapshot(http)) or {}).get("messages") or []
        if not messages:
            return
        message = messages[int(step.pick * len(messages))]
        visibility = "hidden" if step.approve else "visible"
        op = self.history.invoke(
            self.name, "hide", self.thread_id, message_id=message["id"], visibility=visibility
        )
        path = f"/v1/threads/{self.thread_id}/messages/{message['id']}/visibility"
        await self.call(http, op, "POST", path, self.token, {"visibility": visibility})

    async def _cancel(self, http: httpx.AsyncClient, step: Step) -> None:
        """Cancel a queued item (racing its promotion when the run ends): a 200 means the
        send it came from must never be committed."""
        queue = ((await self.snapshot(http)) or {}).get("queue") or []
        if not queue:
            return
        item = queue[int(step.pick * len(queue))]
        marker = re.search(r"\bm-c\d+-\d+\b", str(item.get("text", "")))
        op = self.history.invoke(
            self.name,
            "cancel",
            self.thread_id,
            item_id=item["id"],
            marker=marker and marker.group(0),
        )
        path = f"/v1/threads/{self.thread_id}/queue/{item['id']}"
        await self.call(http, op, "DELETE", path, self.token, None)

    async def _reconnect(self, http: httpx.AsyncClient, step: Step) -> None:
        self.home += 1  # the next session is on the other gateway
        await self.connect()

    async def _resubscribe(self, http: httpx.AsyncClient, step: Step) -> None:
        session = self.session
        if session is None:
            return
        with contextlib.suppress(Exception):
            await session.request({"type": "unsubscribe", "thread_id": self.thread_id})
            await asyncio.sleep(step.pause / 4)
            await session.subscribe(self.thread_id)

    async def _create(self, http: httpx.AsyncClient, step: Step) -> None:
        op = self.history.invoke(self.name, "create", None)
        response = await self.call(http, op, "POST", "/v1/threads", self.token, {})
        if response is not None and response.status_code < 300:
            self.thread_id = response.json()["thread"]["id"]
            self.threads.append(self.thread_id)
            await self.connect()

    async def _join(self, http: httpx.AsyncClient, step: Step) -> None:
        """A late join: follow another thread of the campaign from now on."""
        self.thread_id = self.threads[int(step.pick * len(self.threads))]
        await self.connect()
