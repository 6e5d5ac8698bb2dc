// The websocket to /v1/ws (subscriptions that survive reconnects, ping/pong, backoff; the token
// in a subprotocol, never in the URL): the TypeScript client's core
// (clients/typescript/src/socket.ts), bundled into core.js.
export { CLOSE_UNAUTHORIZED, ThreadSocket, backoffDelay, socketProtocols, socketUrl } from './core.js';
