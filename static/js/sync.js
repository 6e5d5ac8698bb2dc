// Convergence of one thread: the TypeScript client's core (clients/typescript/src/sync.ts),
// bundled into core.js. One implementation for the page, the package and the React hooks;
// the rules are in docs/protocol.md ("How a client converges"), the shared test vectors in
// tests/vectors/convergence/.
export { ACTIVE_RUN_STATUSES, TERMINAL_RUN_STATUSES, ThreadSync, activeRun, foldChunks } from './core.js';
