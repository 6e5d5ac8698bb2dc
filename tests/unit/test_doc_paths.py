"""Every file, folder and module that README.md, tests/README.md and docs/*.md name exists."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "tests" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = ("runtime", "realtime", "server", "threadline_client", "examples", "bench", "tests")
# A backticked path under one of the project's folders (`server/transports/ws/gateway.py`,
# `runtime/engine/`), or a dotted module (`runtime.engine.worker`), up to an optional `:attr`
# or `.Attr` tail; a markdown link's target is a path too.
CODE = re.compile(r"`([^`\s]+)`")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
PATH = re.compile(rf"^(?:{'|'.join(TOP)}|docs|static|deploy|scripts|clients)/[\w./-]*$")
MODULE = re.compile(rf"^(?:{'|'.join(TOP)})(?:\.\w+)+$")


def named_paths(text: str) -> set[str]:
    names = set(CODE.findall(text)) | set(LINK.findall(text))
    return {n.rstrip(".,:;") for n in names if PATH.match(n.rstrip(".,:;"))}


# OpenTelemetry semantic-convention attributes that read like module names of `server`.
ATTRIBUTES = frozenset({"server.address", "server.port"})


def named_modules(text: str) -> set[str]:
    return {n for n in CODE.findall(text) if MODULE.match(n) and n not in ATTRIBUTES}


def module_exists(dotted: str) -> bool:
    """A module, or a module then attributes of it (`runtime.engine.publisher.Publisher`)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:end]))
        except ImportError:
            continue
        for attribute in parts[end:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def test_every_named_path_exists() -> None:
    missing = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for name in named_paths(text):
            base = doc.parent if name.startswith(("../", "./")) else ROOT
            # `bench/*.py`-style globs name a family; check one member exists.
            if "*" in name:
                found = any(ROOT.glob(name))
            else:
                found = (base / name).exists() or (ROOT / name).exists()
            if not found:
                missing.append(f"{doc.relative_to(ROOT)}: {name}")
        for module in named_modules(text):
            if not module_exists(module):
                missing.append(f"{doc.relative_to(ROOT)}: {module}")
    assert not missing, "\n".join(sorted(missing))


def test_the_extractor_finds_paths_and_modules() -> None:
    text = "see `server/transports/ws/gateway.py`, `runtime.engine.worker` and [x](docs/scaling.md)"
    assert named_paths(text) == {"server/transports/ws/gateway.py", "docs/scaling.md"}
    assert named_modules(text) == {"runtime.engine.worker"}
    assert module_exists("runtime.engine.worker")
    assert module_exists("runtime.engine.publisher.Publisher")
    assert not module_exists("runtime.worker")  # the name before the move
    assert not module_exists("server.wsprotocol")
