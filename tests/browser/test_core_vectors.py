"""The shared convergence vectors replayed in Chromium by the static page's core bundle.

`static/js/core.js` is what the page's sync.js, socket.js and presence.js re-export; here it is
loaded from the server as the page loads it, and `replayVector` runs every file of
tests/vectors/convergence/ (the same files node and the Python client replay).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from playwright.sync_api import Browser

from tests.e2e import harness

VECTORS = Path(__file__).resolve().parents[1] / "vectors" / "convergence"

REPLAY = """
async (vectors) => {
  const core = await import('/static/js/core.js');
  const page = await import('/static/js/sync.js');
  const out = { same: page.ThreadSync === core.ThreadSync, failures: {} };
  for (const vector of vectors) out.failures[vector.name] = await core.replayVector(vector);
  return out;
}
"""


def test_vectors_in_chromium(browser: Browser, server: harness.ServerHandle) -> None:
    vectors = [json.loads(p.read_text()) for p in sorted(VECTORS.glob("*.json"))]
    assert len(vectors) >= 8
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"{server.url}/healthz")
        result: dict[str, Any] = page.evaluate(REPLAY, vectors)
    finally:
        context.close()
    assert result["same"], "the page's sync.js does not run the core's ThreadSync"
    assert result["failures"] == {v["name"]: [] for v in vectors}
