// The shared convergence vectors (tests/vectors/convergence/*.json) replayed by the TS core.
import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';

import { VECTORS, loadCore } from './load-core.mjs';

const core = await loadCore();
const files = readdirSync(VECTORS).filter((f) => f.endsWith('.json')).sort();

test('there are vectors', () => assert.ok(files.length >= 8, files.join(', ')));

for (const file of files) {
  test(`vector ${file}`, async () => {
    const vector = JSON.parse(readFileSync(join(VECTORS, file), 'utf8'));
    const failures = await core.replayVector(vector);
    assert.deepEqual(failures, []);
  });
}
