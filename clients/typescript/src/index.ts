// @threadline/client: the protocol's types, the HTTP commands, the websocket session and the
// convergence core (the static page runs this core too: static/js/core.js).
export * from './generated/protocol.js';
export { COMMANDS, type CommandInputs, type CommandName } from './generated/commands.js';
export { DeltaMismatch, applyDelta, type SnapshotDelta } from './delta.js';
export { ApiError, HttpClient, route, type HttpOptions } from './http.js';
export { applyPresence, presenceView, type PresenceMember, type PresenceMembers, type PresenceView } from './presence.js';
export { ActionInbox, ThreadWatch, ThreadlineClient, type ClientOptions, type InboxView, type ThreadView } from './session.js';
export {
  CLOSE_FORBIDDEN,
  CLOSE_UNAUTHORIZED,
  ThreadSocket,
  backoffDelay,
  socketProtocols,
  socketUrl,
  type Frame,
  type SocketState,
  type WebSocketLike,
} from './socket.js';
export {
  ACTIVE_RUN_STATUSES,
  TERMINAL_RUN_STATUSES,
  ThreadSync,
  activeRun,
  foldChunks,
  type ActiveRun,
  type ChunkFrame,
  type LiveChunk,
  type LivePart,
  type LiveView,
} from './sync.js';
export { replayVector, type ConvergenceVector, type VectorResult } from './vectors.js';
