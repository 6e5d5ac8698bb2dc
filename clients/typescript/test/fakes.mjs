// A fake WebSocket, clock and fetch for driving the session without a server.
export class FakeClock {
  constructor() {
    this.now = 0;
    this.timers = new Map();
    this.next = 1;
  }
  setTimeout(fn, ms) {
    const id = this.next++;
    this.timers.set(id, { at: this.now + ms, fn });
    return id;
  }
  clearTimeout(id) {
    this.timers.delete(id);
  }
  /** Run every timer due within `ms` (bounded: a timer chain cannot loop forever). */
  advance(ms) {
    const until = this.now + ms;
    for (let i = 0; i < 1000; i += 1) {
      const due = [...this.timers.entries()].filter(([, t]) => t.at <= until).sort((a, b) => a[1].at - b[1].at)[0];
      if (!due) break;
      this.timers.delete(due[0]);
      this.now = due[1].at;
      due[1].fn();
    }
    this.now = until;
  }
}

export function fakeSockets() {
  const made = [];
  class FakeWebSocket {
    constructor(url, protocols) {
      this.url = url;
      this.protocols = protocols;
      this.sent = [];
      this.closed = null;
      made.push(this);
    }
    send(data) {
      this.sent.push(JSON.parse(data));
    }
    close(code, reason) {
      this.closed = { code, reason };
    }
    // test side
    open() {
      this.onopen?.({});
    }
    receive(frame) {
      this.onmessage?.({ data: JSON.stringify(frame) });
    }
    drop(code = 1006) {
      this.onclose?.({ code });
    }
  }
  return { FakeWebSocket, made };
}

/** fetch answering from `routes(method, url, body)`; records the requests. */
export function fakeFetch(routes) {
  const requests = [];
  const fetch = async (url, init) => {
    const body = init.body ? JSON.parse(init.body) : undefined;
    requests.push({ url, method: init.method, headers: init.headers, body });
    const [status, answer] = await routes(init.method, url, body);
    return new Response(JSON.stringify(answer), { status, headers: { 'Content-Type': 'application/json' } });
  };
  return { fetch, requests };
}

export const flush = () => new Promise((resolve) => setTimeout(resolve, 0));

export function snapshot(version, run = null, extra = {}) {
  return {
    thread: { id: 't1', scope: 'demo', title: '', version, metadata: {} },
    messages: [],
    pending_actions: [],
    run,
    queue: [],
    ...extra,
  };
}
