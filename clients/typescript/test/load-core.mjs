// The core compiled from src/ (not the committed bundle): tests see the source as it is now.
import { build } from 'esbuild';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';

const here = dirname(fileURLToPath(import.meta.url));

export async function loadCore() {
  const result = await build({
    entryPoints: [join(here, '..', 'src', 'index.ts')],
    bundle: true,
    format: 'esm',
    platform: 'neutral',
    target: 'es2022',
    write: false,
    logLevel: 'error',
  });
  const code = Buffer.from(result.outputFiles[0].text).toString('base64');
  return import(`data:text/javascript;base64,${code}`);
}

export const VECTORS = join(here, '..', '..', '..', 'tests', 'vectors', 'convergence');
