// A small React app on the hooks: one thread (live reply, pending actions with a form from
// their schema, stop), who is here, the action inbox, the connection. Built with esbuild by
// build.mjs; tests/browser/test_react_app.py serves it and drives two users through it.
// The token and thread come from the URL's fragment (#token=...&thread=...), never sent to a server.
import { StrictMode, useState } from 'react';
import { createRoot } from 'react-dom/client';

import { ThreadlineClient } from '../../src/index.js';
import { type ThreadAction, ThreadlineProvider, useConnection, useInbox, usePresence, useThread } from '../../src/react/index.js';

function PayloadForm({ action }: { action: ThreadAction }) {
  const properties = (action.schema.properties ?? {}) as Record<string, { type?: string; title?: string }>;
  const [values, setValues] = useState<Record<string, unknown>>({});
  const [status, setStatus] = useState('');
  const submit = (extra: Record<string, unknown>) => {
    setStatus('sending');
    action.resume({ ...values, ...extra }).then(
      () => setStatus('resolved'),
      (err: { code?: string; message?: string }) => setStatus(`error: ${err.code ?? err.message}`),
    );
  };
  return (
    <form data-testid="action" data-action-id={action.id} data-tool={action.tool_name} onSubmit={(e) => e.preventDefault()}>
      <strong>{action.tool_name}</strong> <code>{JSON.stringify(action.input)}</code>
      {Object.entries(properties)
        .filter(([name, field]) => field.type === 'string' || (name !== 'approved' && field.type !== 'boolean'))
        .map(([name, field]) => (
          <label key={name}>
            {field.title ?? name}
            <input data-field={name} onChange={(e) => setValues({ ...values, [name]: e.target.value })} />
          </label>
        ))}
      {'approved' in properties ? (
        <>
          <button type="button" data-testid="approve" onClick={() => submit({ approved: true })}>
            Approve
          </button>
          <button type="button" data-testid="deny" onClick={() => submit({ approved: false })}>
            Deny
          </button>
        </>
      ) : (
        <button type="button" data-testid="submit" onClick={() => submit({})}>
          Submit
        </button>
      )}
      <span data-testid="action-status">{status}</span>
    </form>
  );
}

function partsText(parts: unknown): string {
  if (!Array.isArray(parts)) return '';
  return parts
    .map((p: { type?: string; text?: string }) => (p && p.type === 'text' ? (p.text ?? '') : ''))
    .join('');
}

function Thread({ threadId }: { threadId: string }) {
  const thread = useThread(threadId);
  const presence = usePresence(threadId);
  const [text, setText] = useState('');
  const messages = thread.snapshot?.messages ?? [];
  return (
    <section>
      <p>
        version <span data-testid="version">{thread.snapshot?.thread.version ?? -1}</span>, run{' '}
        <span data-testid="run-status">{thread.runStatus ?? 'none'}</span>
        {thread.resyncing ? <em data-testid="resyncing"> resyncing</em> : null}
      </p>
      <ul data-testid="presence">
        {presence.here.map((m) => (
          <li key={m.subject} data-testid="member" data-subject={m.subject}>
            {m.name}
            {m.me ? ' (me)' : ''}
          </li>
        ))}
      </ul>
      <ol data-testid="messages">
        {messages.map((m) => (
          <li key={m.id} data-testid="message" data-role={m.role}>
            {partsText(m.parts)}
          </li>
        ))}
      </ol>
      <p data-testid="live-text">{thread.liveText}</p>
      {thread.pendingActions.map((action) => (
        <PayloadForm key={action.id} action={action} />
      ))}
      <form
        onSubmit={(e) => {
          e.preventDefault();
          if (!text) return;
          void thread.send(text);
          setText('');
          presence.setTyping(false);
        }}
      >
        <input
          data-testid="composer"
          value={text}
          onChange={(e) => {
            setText(e.target.value);
            presence.setTyping(Boolean(e.target.value));
          }}
        />
        <button type="submit" data-testid="send">
          Send
        </button>
        <button type="button" data-testid="stop" onClick={() => void thread.stop()}>
          Stop
        </button>
      </form>
    </section>
  );
}

function Inbox() {
  const inbox = useInbox();
  return (
    <aside>
      inbox: <span data-testid="inbox-count">{inbox.loading ? '…' : inbox.actions.length}</span>
    </aside>
  );
}

function App({ threadId }: { threadId: string }) {
  const connection = useConnection();
  return (
    <main>
      <header>
        connection: <span data-testid="connection">{connection}</span>
      </header>
      <Inbox />
      <Thread threadId={threadId} />
    </main>
  );
}

const params = new URLSearchParams(window.location.hash.slice(1));
const client = new ThreadlineClient({ token: params.get('token') ?? '' });
// For the test's eyes only: the page load it started with (a reload would make a new one).
(window as unknown as { __app: object }).__app = { client, loadId: Math.random() };
const root = document.getElementById('root');
if (root) {
  createRoot(root).render(
    <StrictMode>
      <ThreadlineProvider client={client}>
        <App threadId={params.get('thread') ?? ''} />
      </ThreadlineProvider>
    </StrictMode>,
  );
}
