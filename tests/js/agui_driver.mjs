// Drives one AG-UI run with the official @ag-ui/client HttpAgent; prints a JSON report.
// Input (argv[2], JSON): {url, token, threadId, threadlineId?, text?, messages?, resume?, stopAfterDeltas?,
// abortAfterDeltas?, readyFile?}. The report holds the events the client library saw, the raw
// SSE data lines it was sent (for validation against ag-ui-protocol's pydantic models), and
// the messages and shared state the library reconstructed.
import { writeFileSync } from "node:fs";
import { randomUUID } from "node:crypto";
import { HttpAgent } from "@ag-ui/client";

const options = JSON.parse(process.argv[2]);
const raw = [];
const recorders = [];
const readers = [];

// Keep a copy of every SSE line the server sent, while the library reads the same bytes.
async function recordingFetch(url, init) {
  const response = await fetch(url, init);
  if (!response.body) return response;
  const [forAgent, forRecord] = response.body.tee();
  const recorder = (async () => {
    const decoder = new TextDecoder();
    let buffered = "";
    const reader = forRecord.getReader();
    readers.push(reader);
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      buffered += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffered.indexOf("\n")) >= 0) {
        const line = buffered.slice(0, end).trimEnd();
        buffered = buffered.slice(end + 1);
        if (line.startsWith("data: ")) raw.push(line.slice(6));
      }
    }
  })().catch(() => {});
  recorders.push(recorder);
  return new Response(forAgent, { status: response.status, headers: response.headers });
}

const agent = new HttpAgent({
  url: `${options.url}/v1/ag-ui`,
  headers: { Authorization: `Bearer ${options.token}` },
  threadId: options.threadId,
  initialMessages: options.messages ?? [],
  fetch: recordingFetch,
});
if (options.text) {
  agent.addMessage({ id: randomUUID(), role: "user", content: options.text });
}

const events = [];
let runId = null;
let deltas = 0;
let outcome = null;
let interrupts = [];
let stopAnswer = null;
let error = null;
let aborted = false;

async function stopRun() {
  const response = await fetch(
    `${options.url}/v1/threads/${options.threadlineId ?? options.threadId}/runs/${runId}/stop`,
    { method: "POST", headers: { Authorization: `Bearer ${options.token}` } },
  );
  stopAnswer = response.status;
}

const subscriber = {
  onEvent({ event }) {
    events.push(event);
    if (event.type === "RUN_STARTED") runId = event.runId;
    if (event.type !== "TEXT_MESSAGE_CONTENT") return;
    deltas += 1;
    if (deltas === 1 && options.readyFile) writeFileSync(options.readyFile, runId ?? "");
    if (deltas === options.stopAfterDeltas) return stopRun();
    if (deltas === options.abortAfterDeltas) {
      aborted = true;
      agent.abortRun();
      for (const reader of readers) reader.cancel().catch(() => {});
    }
  },
  onRunFinishedEvent(params) {
    outcome = params.outcome;
    if (params.outcome === "interrupt") interrupts = params.interrupts;
  },
};

try {
  await agent.runAgent({ runId: randomUUID(), resume: options.resume }, subscriber);
} catch (exc) {
  error = String(exc?.message ?? exc);
}
// Let the recorder drain what the server sent (an aborted stream ends it at once).
await Promise.race([
  aborted ? Promise.resolve() : Promise.all(recorders),
  new Promise((resolve) => setTimeout(resolve, 5000)),
]);
process.stdout.write(
  JSON.stringify({
    runId,
    outcome,
    interrupts,
    pendingInterrupts: agent.pendingInterrupts,
    stopAnswer,
    error,
    events,
    raw,
    messages: agent.messages,
    state: agent.state,
  }),
);
