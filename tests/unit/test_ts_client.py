"""The TypeScript client (clients/typescript/): its node tests, its type check, and freshness.

Freshness: `src/generated/` is regenerated from the wire models and the command table
(scripts/ts_protocol.py, then scripts/generate.mjs) and `static/js/core.js` is rebuilt from
`src/` (scripts/build-static.mjs); each must equal the committed file (`make ts-generate`,
`make ts-build` rewrite them).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "clients" / "typescript"
GENERATED = PACKAGE / "src" / "generated"
BUNDLE = ROOT / "static" / "js" / "core.js"


def _node() -> str:
    node = shutil.which("node")
    missing = None if node else "node is not installed"
    if node and not (PACKAGE / "node_modules" / ".bin" / "tsc").exists():
        missing = "clients/typescript/node_modules is missing (npm ci --prefix clients/typescript)"
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true: {missing}")
        pytest.skip(missing)
    assert node is not None
    return node


def _run(*args: str, cwd: Path = ROOT) -> str:
    result = subprocess.run(
        list(args), cwd=cwd, capture_output=True, text=True, timeout=180, check=False
    )
    assert result.returncode == 0, (
        f"{' '.join(args)} failed ({result.returncode})\n{result.stdout}\n{result.stderr}"
    )
    return result.stdout


def test_node_tests() -> None:
    """The core's tests in node: the shared vectors, the HTTP routes, the session."""
    _run(_node(), "--test", "test/", cwd=PACKAGE)


def test_typecheck() -> None:
    _node()
    _run(str(PACKAGE / "node_modules" / ".bin" / "tsc"), "--noEmit", "-p", ".", cwd=PACKAGE)


def test_generated_types_are_fresh(tmp_path: Path) -> None:
    node = _node()
    document = tmp_path / "protocol.json"
    _run(sys.executable, "scripts/ts_protocol.py", str(document))
    _run(node, "scripts/generate.mjs", str(document), str(tmp_path / "out"), cwd=PACKAGE)
    for name in ("protocol.ts", "commands.ts"):
        fresh = (tmp_path / "out" / name).read_text()
        assert fresh == (GENERATED / name).read_text(), (
            f"clients/typescript/src/generated/{name} is stale: run `make ts-generate`"
        )


def test_static_bundle_is_fresh(tmp_path: Path) -> None:
    node = _node()
    out = tmp_path / "core.js"
    _run(node, "scripts/build-static.mjs", str(out), cwd=PACKAGE)
    assert out.read_text() == BUNDLE.read_text(), "static/js/core.js is stale: run `make ts-build`"
