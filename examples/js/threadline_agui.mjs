// Threadline's two additions to @ag-ui/client's HttpAgent (1.0.0 leaves both to subclasses):
// connectAgent() reattaches to the thread's run in flight, getCapabilities() reads what the
// server supports. No imports of its own: pass the @ag-ui/client module you load.
//
//   import * as agui from "@ag-ui/client";
//   import { withThreadline } from "./threadline_agui.mjs";
//   const ThreadlineAgent = withThreadline(agui);
//   const agent = new ThreadlineAgent({ url: "/v1/ag-ui", headers, threadId });
//   await agent.connectAgent();          // the rest of the run in flight, if any
//   await agent.getCapabilities();       // GET /v1/ag-ui/info
export function withThreadline(agui) {
  return class ThreadlineAgent extends agui.HttpAgent {
    // POST <url>/connect: the same events as a join, and it never writes (no message is sent,
    // no interrupt resumed), so a reconnecting page cannot post twice what it already sent.
    connect(input) {
      const init = this.requestInit(agui.enforceOutgoingInput(input));
      return agui.transformHttpEventStream(
        agui.runHttpRequest(() => this.fetch(`${this.url}/connect`, init)),
        this.debugLogger,
      );
    }

    async getCapabilities() {
      const response = await this.fetch(`${this.url}/info`, { headers: this.headers });
      if (!response.ok) throw new Error(`HTTP ${response.status}: ${await response.text()}`);
      return (await response.json()).capabilities;
    }
  };
}
