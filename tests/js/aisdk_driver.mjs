// Drives a chat with the AI SDK's own chat logic (AbstractChat, the core of useChat) over
// DefaultChatTransport; prints a JSON report (messages as the SDK built them, raw SSE lines).
// Input (argv[2], JSON): {url, token, chatId, text, approve?: {approved, reason?},
// stopAfterDeltas?: n (the SDK's stop(), then a fresh chat holding only the user message
// resumes the stream with resumeStream(), as a reloaded page does), stopRouteAfterDeltas?: n
// (the documented stop: examples/js/threadline_aisdk.mjs's stopChat, then the SDK's stop())}.
import {
  AbstractChat,
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
} from "ai";
import { stopChat } from "../../examples/js/threadline_aisdk.mjs";

const options = JSON.parse(process.argv[2]);
const raw = [];
let deltas = 0;
let onDelta = () => {};

class State {
  constructor(messages = []) {
    this.status = "ready";
    this.error = undefined;
    this.messages = messages;
  }
  pushMessage(message) {
    this.messages = this.messages.concat(message);
  }
  popMessage() {
    this.messages = this.messages.slice(0, -1);
  }
  replaceMessage(index, message) {
    this.messages = [
      ...this.messages.slice(0, index),
      this.snapshot(message),
      ...this.messages.slice(index + 1),
    ];
  }
  snapshot(thing) {
    return structuredClone(thing);
  }
}

class Chat extends AbstractChat {
  constructor(init, messages) {
    super({ ...init, state: new State(messages) });
  }
}

// Records every SSE data line while the SDK reads the same bytes.
async function recordingFetch(url, init) {
  const response = await fetch(url, init);
  if (!response.body || response.status !== 200) return response;
  const decoder = new TextDecoder();
  let buffered = "";
  const record = new TransformStream({
    transform(piece, controller) {
      buffered += decoder.decode(piece, { stream: true });
      let end;
      while ((end = buffered.indexOf("\n")) >= 0) {
        const line = buffered.slice(0, end).trimEnd();
        buffered = buffered.slice(end + 1);
        if (!line.startsWith("data: ")) continue;
        raw.push(line.slice(6));
        if (line.includes('"type":"text-delta"')) {
          deltas += 1;
          onDelta(deltas);
        }
      }
      controller.enqueue(piece);
    },
  });
  return new Response(response.body.pipeThrough(record), {
    status: response.status,
    headers: response.headers,
  });
}

const errors = [];
function chat(messages = []) {
  return new Chat(
    {
      id: options.chatId,
      transport: new DefaultChatTransport({
        api: `${options.url}/v1/ai-sdk/chat`,
        headers: { Authorization: `Bearer ${options.token}` },
        fetch: recordingFetch,
      }),
      sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
      onError: (error) => errors.push(String(error?.message ?? error)),
    },
    messages,
  );
}

async function settled(target) {
  for (let i = 0; i < 600 && target.status !== "ready" && target.status !== "error"; i++) {
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

const first = chat();
let resumed = null;
let approvalId = null;
let stopAnswer = null;
if (options.stopRouteAfterDeltas) {
  const api = `${options.url}/v1/ai-sdk/chat`;
  const headers = { Authorization: `Bearer ${options.token}` };
  let stopping = null;
  onDelta = (count) => {
    if (count !== options.stopRouteAfterDeltas) return;
    stopping = stopChat({ api, chatId: options.chatId, headers }).then((answer) => {
      stopAnswer = answer;
      return first.stop();
    });
  };
  await first.sendMessage({ text: options.text });
  await stopping;
  await settled(first);
} else if (options.stopAfterDeltas) {
  let stopping = null;
  onDelta = (count) => {
    if (count === options.stopAfterDeltas) stopping = first.stop();
  };
  await first.sendMessage({ text: options.text });
  await stopping;
  const cutAt = deltas;
  // A reloaded page: it kept the user's message and asks for the stream in flight.
  resumed = chat(first.messages.filter((message) => message.role === "user"));
  await resumed.resumeStream();
  await settled(resumed);
  resumed = { messages: resumed.messages, status: resumed.status, deltasBeforeStop: cutAt };
} else {
  await first.sendMessage({ text: options.text });
  await settled(first);
  if (options.approve) {
    const part = first.lastMessage.parts.find((p) => p.state === "approval-requested");
    approvalId = part?.approval?.id ?? null;
    if (part) {
      // The SDK marks the part answered and, by sendAutomaticallyWhen, posts the messages.
      await first.addToolApprovalResponse({ id: part.approval.id, ...options.approve });
      await new Promise((resolve) => setTimeout(resolve, 100));
      await settled(first);
    }
  }
}

process.stdout.write(
  JSON.stringify({
    messages: first.messages,
    status: first.status,
    approvalId,
    stopAnswer,
    resumed,
    errors,
    raw,
  }),
);
