// Bundles the core (src/index.ts) into static/js/core.js, the ES module the page imports, so
// the page and this package share one convergence implementation and `make run` needs no node.
// Usage: node scripts/build-static.mjs [OUT_FILE] (tests/unit/test_ts_client.py checks freshness).
import { build } from 'esbuild';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';

const here = dirname(fileURLToPath(import.meta.url));
const out = process.argv[2] || join(here, '..', '..', '..', 'static', 'js', 'core.js');

await build({
  entryPoints: [join(here, '..', 'src', 'index.ts')],
  outfile: out,
  bundle: true,
  format: 'esm',
  target: 'es2022',
  platform: 'browser',
  legalComments: 'none',
  charset: 'utf8',
  logLevel: 'warning',
  banner: {
    js:
      '// Generated from clients/typescript/src by clients/typescript/scripts/build-static.mjs: do not edit.\n' +
      '// Rebuild: make ts-build (tests/unit/test_ts_client.py fails when this is stale).',
  },
});
