// Stopping a useChat run on Threadline: the AI SDK's stop() only aborts the fetch, which the
// server cannot tell from a closed tab, so the run goes on (and a reloaded page resumes it).
// To stop it for everyone, post the chat's stop route; the open stream then ends by itself
// with an `abort` chunk and `finish`, and the chat is `ready` again. No imports of its own.
//
//   import { stopChat } from "./threadline_aisdk.mjs";
//   const { id, stop } = useChat({ transport: new DefaultChatTransport({ api, headers }) });
//   <button onClick={() => stopChat({ api, chatId: id, headers })}>Stop</button>
//
// Resolves to the route's answer: {thread_id, version, run_id, status} of the chat's last run.
export async function stopChat({ api, chatId, headers = {}, fetch: send = fetch }) {
  const response = await send(`${api}/${encodeURIComponent(chatId)}/stop`, {
    method: "POST",
    headers,
  });
  const answer = await response.json();
  if (!response.ok) {
    throw new Error(`stop refused (${response.status}): ${answer?.error?.message ?? "unknown"}`);
  }
  return answer;
}
