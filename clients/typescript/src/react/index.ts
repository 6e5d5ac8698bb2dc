// React hooks over the client core: useThread, useInbox, usePresence, useConnection.
// Entry point `@threadline/client/react`; React is a peer dependency (18 or newer).
import { createContext, createElement, useCallback, useContext, useEffect, useMemo, useState, useSyncExternalStore } from 'react';
import type { ReactNode } from 'react';

import type * as P from '../generated/protocol.js';
import { type PresenceMembers, type PresenceView, presenceView } from '../presence.js';
import type { ActionInbox, InboxView, ThreadView, ThreadWatch, ThreadlineClient } from '../session.js';
import type { SocketState } from '../socket.js';

const ClientContext = createContext<ThreadlineClient | null>(null);

/** Makes `client` the one the hooks below use. */
export function ThreadlineProvider({ client, children }: { client: ThreadlineClient; children?: ReactNode }): ReactNode {
  useEffect(() => {
    client.connect();
  }, [client]);
  return createElement(ClientContext.Provider, { value: client }, children);
}

export function useThreadlineClient(): ThreadlineClient {
  const client = useContext(ClientContext);
  if (!client) throw new Error('useThreadlineClient: no <ThreadlineProvider client={...}> above this component');
  return client;
}

const noSubscribe = (): (() => void) => () => {};

/** A reference-counted watch of `threadId` held while the component is mounted. */
function useWatch(threadId: string | null): ThreadWatch | null {
  const client = useThreadlineClient();
  const [watch, setWatch] = useState<ThreadWatch | null>(null);
  useEffect(() => {
    if (!threadId) {
      setWatch(null);
      return undefined;
    }
    const held = client.watch(threadId);
    setWatch(held);
    return () => client.release(held);
  }, [client, threadId]);
  return watch && watch.threadId === threadId ? watch : null;
}

/** A pending action with its payload form's JSON Schema and the call that resolves it. */
export interface ThreadAction extends P.PendingAction {
  /** The JSON Schema of the resume payload (pydantic's `model_json_schema()`). */
  schema: Record<string, unknown>;
  resume(payload: Record<string, unknown>): Promise<P.VersionAnswer>;
}

export interface UseThread extends Omit<ThreadView, 'pendingActions'> {
  loading: boolean;
  pendingActions: ThreadAction[];
  send(text: string, options?: { policy?: P.InputPolicy }): Promise<P.AdmissionAnswer>;
  stop(): Promise<P.StopAnswer | null>;
  resume(actionId: string, payload: Record<string, unknown>): Promise<P.VersionAnswer>;
  regenerate(messageId?: string): Promise<P.RegenerateAnswer>;
  retry(runId?: string): Promise<P.RegenerateAnswer>;
}

const notWatching = (): Promise<never> => Promise.reject(new Error('useThread: no thread'));

/**
 * One thread, converged: the committed snapshot, the live text on top of it, the pending
 * actions (with their forms' schemas), the queue, the run's status, and the commands.
 */
export function useThread(threadId: string | null): UseThread {
  const watch = useWatch(threadId);
  const view = useSyncExternalStore(watch ? watch.subscribe : noSubscribe, () => (watch ? watch.getView() : null));
  return useMemo(() => {
    const base: ThreadView = view ?? {
      threadId: threadId ?? '',
      snapshot: null,
      live: { runId: null, parts: [], toolStates: {}, takeover: null, text: '' },
      liveText: '',
      pendingActions: [],
      queue: [],
      run: null,
      runStatus: null,
      resyncing: true,
      connection: 'idle',
      presence: {},
      error: null,
    };
    const pendingActions = base.pendingActions.map((action) => ({
      ...action,
      schema: (action.schema ?? {}) as Record<string, unknown>,
      resume: (payload: Record<string, unknown>) => (watch ? watch.resume(action.id, payload) : notWatching()),
    }));
    return {
      ...base,
      loading: !base.snapshot,
      pendingActions,
      send: (text, options) => (watch ? watch.send(text, options) : notWatching()),
      stop: () => (watch ? watch.stop() : notWatching()),
      resume: (actionId, payload) => (watch ? watch.resume(actionId, payload) : notWatching()),
      regenerate: (messageId) => (watch ? watch.regenerate(messageId) : notWatching()),
      retry: (runId) => (watch ? watch.retry(runId) : notWatching()),
    };
  }, [view, watch, threadId]);
}

export interface UseInbox extends InboxView {
  resume(action: P.PendingAction, payload: Record<string, unknown>): Promise<P.VersionAnswer>;
}

/** The pending actions of every thread the token's scopes see, live (the action inbox). */
export function useInbox(): UseInbox {
  const client = useThreadlineClient();
  const [inbox, setInbox] = useState<ActionInbox | null>(null);
  useEffect(() => {
    const held = client.actionInbox();
    setInbox(held);
    return () => client.releaseInbox(held);
  }, [client]);
  const view = useSyncExternalStore(inbox ? inbox.subscribe : noSubscribe, () => (inbox ? inbox.getView() : null));
  const resume = useCallback(
    (action: P.PendingAction, payload: Record<string, unknown>) => {
      if (!action.thread_id) return Promise.reject(new Error('useInbox: the action names no thread'));
      return client.http.resume(action.thread_id, action.id, payload);
    },
    [client],
  );
  return useMemo(() => ({ ...(view ?? { actions: [], loading: true, error: null }), resume }), [view, resume]);
}

export interface UsePresence extends PresenceView {
  members: PresenceMembers;
  me: string | null;
  setTyping(typing: boolean): boolean;
  setReviewing(actionId: string | null): boolean;
}

/** Who else is in the thread, who types, who reviews which action; and telling them about me. */
export function usePresence(threadId: string | null): UsePresence {
  const client = useThreadlineClient();
  const watch = useWatch(threadId);
  const [me, setMe] = useState<string | null>(null);
  useEffect(() => {
    let live = true;
    client.me().then(
      (principal) => live && setMe(principal.subject),
      () => undefined,
    );
    return () => {
      live = false;
    };
  }, [client]);
  const view = useSyncExternalStore(watch ? watch.subscribe : noSubscribe, () => (watch ? watch.getView() : null));
  const members = view ? view.presence : {};
  return useMemo(
    () => ({
      members,
      me,
      ...presenceView(members, me),
      setTyping: (typing: boolean) => (watch ? watch.setPresence({ typing }) : false),
      setReviewing: (actionId: string | null) => (watch ? watch.setPresence({ reviewing: actionId }) : false),
    }),
    [members, me, watch],
  );
}

/** The websocket's state: idle, connecting, open, reconnecting, unauthorized, closed. */
export function useConnection(): SocketState {
  const client = useThreadlineClient();
  return useSyncExternalStore(client.connection.subscribe, () => client.socket.state);
}
