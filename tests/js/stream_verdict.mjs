// Feeds a recorded SSE stream (the campaign's events, re-encoded as the server sent them: one
// `data:` line per event, then `data: [DONE]` for the AI SDK when it came) to the protocol's
// own client, and prints its verdict as JSON.
// Input (argv[2], JSON): {transport: "ag-ui" | "ai-sdk", events: [...], done?: bool}.
// AG-UI: @ag-ui/client's event verifier over the events, then its HttpAgent over those bytes.
// AI SDK: the `ai` package's AbstractChat over DefaultChatTransport (useChat's core).
// Output: {transport, verdict: "accepted" | "rejected", error, status?, messages?}; "rejected"
// is the client refusing the bytes (a verifier or chunk schema error), not a run's own error.
import * as agui from "@ag-ui/client";
import { AbstractChat, DefaultChatTransport } from "ai";
import { from, lastValueFrom, toArray } from "rxjs";

const input = JSON.parse(process.argv[2]);

function bytes() {
  let body = input.events.map((event) => `data: ${JSON.stringify(event)}\n\n`).join("");
  if (input.done) body += "data: [DONE]\n\n";
  return body;
}

function reply(headers) {
  return async () =>
    new Response(bytes(), { status: 200, headers: { "content-type": "text/event-stream", ...headers } });
}

// The verifier alone over every event (the agent stops at the first RUN_ERROR it applies).
async function verifier() {
  try {
    await lastValueFrom(agui.verifyEvents(false)(from(input.events)).pipe(toArray()));
    return null;
  } catch (error) {
    return String(error?.message ?? error);
  }
}

async function agUi() {
  const refused = await verifier();
  if (refused !== null) return { verdict: "rejected", error: refused };
  const agent = new agui.HttpAgent({ url: "http://127.0.0.1:9/v1/ag-ui", fetch: reply({}) });
  const runErrors = [];
  try {
    await agent.runAgent({}, { onRunErrorEvent: ({ event }) => runErrors.push(event) });
  } catch (error) {
    const message = String(error?.message ?? error);
    // A RUN_ERROR the verifier let through is the run's own error, reported to the caller.
    const own = runErrors.some((event) => event.message === message);
    return { verdict: own ? "accepted" : "rejected", error: message, runErrors };
  }
  return { verdict: "accepted", error: null, runErrors, messages: agent.messages };
}

class State {
  constructor() {
    this.status = "ready";
    this.error = undefined;
    this.messages = [];
  }
  pushMessage(message) {
    this.messages = this.messages.concat(message);
  }
  popMessage() {
    this.messages = this.messages.slice(0, -1);
  }
  replaceMessage(index, message) {
    this.messages = [...this.messages.slice(0, index), structuredClone(message), ...this.messages.slice(index + 1)];
  }
  snapshot(thing) {
    return structuredClone(thing);
  }
}

class Chat extends AbstractChat {
  constructor(init) {
    super({ ...init, state: new State() });
  }
}

async function aiSdk() {
  const errors = [];
  const chat = new Chat({
    id: "chat",
    transport: new DefaultChatTransport({
      api: "http://127.0.0.1:9/v1/ai-sdk/chat",
      fetch: reply({ "x-vercel-ai-ui-message-stream": "v1" }),
    }),
    onError: (error) => errors.push(String(error?.message ?? error)),
  });
  await chat.sendMessage({ text: "hello" });
  for (let i = 0; i < 200 && chat.status !== "ready" && chat.status !== "error"; i++) {
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  const error = errors[0] ?? null;
  // An `error` part the SDK parsed is the stream's own error (the chat's error state).
  const own = error !== null && input.events.some((event) => event.type === "error" && event.errorText === error);
  const verdict = error === null || own ? "accepted" : "rejected";
  return { verdict, error, status: chat.status, messages: chat.messages };
}

const result = input.transport === "ag-ui" ? await agUi() : await aiSdk();
if (result.error) result.error = result.error.slice(0, 300);
process.stdout.write(JSON.stringify({ transport: input.transport, ...result }) + "\n");
