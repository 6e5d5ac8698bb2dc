"""Import contracts: the package layering and the examples' public-API rule, on every import."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("runtime", "realtime", "server", "threadline_client", "threadline_wire")
# The layers inside the packages. A module belongs to the first layer whose prefix names it (a
# prefix ending in "." names the package's top-level modules only).
LAYERS: tuple[tuple[str, str], ...] = (
    ("runtime.__init__", "runtime.api"),  # the authors' façade re-exports every layer
    ("runtime.engine", "runtime.engine"),  # the spec's loop
    ("runtime.service", "runtime.service"),  # what the gateway calls
    ("runtime.hooks", "runtime.hooks"),  # timers, schedules, webhook delivery
    ("runtime.storage", "runtime.storage"),
    ("runtime.providers", "runtime.authoring"),  # models are part of what authors write with
    ("runtime.demo", "runtime.demo"),
    # How a server is declared is authoring vocabulary (Agent.mcp_servers, Settings); the
    # client machinery (the SDK's sessions, the tools built from them) is a layer of its own.
    ("runtime.mcp.config", "runtime.authoring"),
    ("runtime.mcp", "runtime.mcp"),
    ("runtime.", "runtime.authoring"),  # the vocabulary agent authors write with
    ("realtime", "realtime"),
    ("server.protocol_catalog", "server.composition"),
    ("server.app", "server.composition"),
    ("server.cli", "server.composition"),
    ("server.hooks_cli", "server.composition"),
    ("server.protocol", "server.protocol"),  # the command table and wire models
    ("server.transports", "server.transports"),  # http, ws, sse
    ("server.live", "server.live"),  # inbox, presence, revocation, quotas
    ("server.", "server.base"),  # settings, auth, logs, tracing
    ("threadline_client", "threadline_client"),
    ("threadline_wire", "threadline_wire"),  # wire answers both ends import
)
# The wire's models (chunks, frames, enums) are the authoring layer's vocabulary too, so every
# layer above it may name them where they are declared.
_RUNTIME_BELOW = frozenset({"runtime.authoring", "threadline_wire"})
# What each layer may import of the other layers; anything not listed is forbidden.
ALLOWED: dict[str, frozenset[str]] = {
    "realtime": frozenset({"threadline_wire"}),  # the live frames clients read are the wire's
    "threadline_wire": frozenset(),  # pydantic only: the server and the client may both use it
    # The client talks to the server over the wire only, with the models the server answers in.
    "threadline_client": frozenset({"threadline_wire"}),
    "runtime.authoring": frozenset({"realtime", "threadline_wire"}),
    "runtime.demo": _RUNTIME_BELOW,
    "runtime.mcp": _RUNTIME_BELOW,
    "runtime.storage": frozenset({"runtime.authoring", "realtime"}),
    # The engine never imports the service: the service starts what the engine runs.
    "runtime.engine": _RUNTIME_BELOW | {"runtime.storage", "runtime.mcp", "realtime"},
    "runtime.service": _RUNTIME_BELOW | {"runtime.storage", "runtime.engine", "realtime"},
    # Beside the service: the engine never starts a timer's work, the service never delivers.
    "runtime.hooks": _RUNTIME_BELOW
    | {"runtime.storage", "runtime.engine", "runtime.service", "realtime"},
    "runtime.api": _RUNTIME_BELOW
    | {"runtime.demo", "runtime.engine", "runtime.service", "runtime.storage", "realtime"}
    | {"runtime.mcp"},
    "server.base": frozenset({"runtime.authoring", "runtime.service", "runtime.storage"}),
    # threadline_wire: the snapshot deltas the gateway builds are the wire's (as realtime's frames).
    "server.live": frozenset(
        {"runtime.authoring", "runtime.storage", "server.base", "realtime", "threadline_wire"}
    ),
    "server.protocol": frozenset(
        {"runtime.authoring", "runtime.service", "runtime.storage", "runtime.hooks"}
    )
    | {"server.live", "server.base", "realtime", "threadline_wire"},
    # Transports never touch storage or the engine: every effect goes through the command table.
    "server.transports": frozenset({"runtime.authoring", "runtime.service"})
    | {"server.protocol", "server.live", "server.base", "realtime", "threadline_wire"},
    "server.composition": frozenset(
        {"runtime.api", "runtime.authoring", "runtime.engine", "runtime.service", "runtime.hooks"}
        | {"runtime.storage", "runtime.demo", "realtime", "threadline_wire"}
        | {"server.base", "server.protocol", "server.transports", "server.live"}
    ),
}


def layer_of(module: str) -> str | None:
    """The layer a module (or a package's `__init__`, named by the package) belongs to."""
    if module == "runtime":
        return "runtime.api"
    if module == "server":
        return "server.base"
    for prefix, layer in LAYERS:
        if prefix.endswith("."):
            if module.startswith(prefix) and module.count(".") == 1:
                return layer
        elif module == prefix or module.startswith(prefix + "."):
            return layer
    return None


def imported_layer(name: str) -> str | None:
    """The layer of an imported name: `from runtime import Agent` imports the façade's
    vocabulary (the authoring layer), `import runtime.engine` a package of its own."""
    return "runtime.authoring" if name == "runtime" else layer_of(name)


def imported_modules(source: str, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in `source`, wherever it stands: inside
    functions, under `if TYPE_CHECKING:` and in `try` blocks as well as at the top."""
    # The package a relative import starts from: the module itself for an __init__.py.
    package = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            yield node.lineno, name


def module_name(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return ".".join(parts), is_package


def layer_imports() -> list[tuple[str, str, str]]:
    """(importing file:line, importing layer, imported layer) across every package."""
    edges = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            module, is_package = module_name(path)
            source = "runtime.api" if module == "runtime" else layer_of(module)
            assert source is not None, f"{path} is in no layer"
            for line, name in imported_modules(path.read_text(), module, is_package):
                target = imported_layer(name) if name.split(".")[0] in PACKAGES else None
                if target is not None and target != source:
                    edges.append((f"{path.relative_to(ROOT)}:{line}", source, target))
    return edges


def forbidden_edges(edges: list[tuple[str, str, str]]) -> list[str]:
    return [
        f"{where}: {source} imports {target}"
        for where, source, target in edges
        if target not in ALLOWED[source]
    ]


def test_the_checker_sees_imports_inside_functions_and_relative_ones() -> None:
    source = (
        "import realtime.bus\n"
        "def late():\n"
        "    from server import app\n"
        "    if True:\n"
        "        import runtime.storage as s\n"
        "from . import sibling\n"
        "from ..outer import thing\n"
    )
    found = [name for _, name in imported_modules(source, "runtime.providers.model_api", False)]
    assert sorted(found) == [
        "realtime.bus",
        "runtime.outer",
        "runtime.providers",
        "runtime.storage",
        "server",
    ]
    init = [name for _, name in imported_modules("from . import x\n", "runtime.demo", True)]
    assert init == ["runtime.demo"]


def test_layers_import_only_what_the_layering_allows() -> None:
    edges = layer_imports()
    assert edges, "the walk found no cross-layer import at all: it is looking in the wrong place"
    assert {source for _, source, _ in edges} >= set(ALLOWED) - {"realtime", "threadline_wire"}
    assert forbidden_edges(edges) == []


@pytest.mark.parametrize(
    ("module", "source", "why"),
    [
        (
            "runtime.engine.worker",
            "from runtime.service.thread_service import ThreadService\n",
            "the engine imports the service",
        ),
        (
            "server.transports.http_routes",
            "from runtime.storage.store import Store\n",
            "a transport imports storage",
        ),
        (
            "server.transports.sse.agui",
            "import runtime.engine.worker\n",
            "a transport imports the engine",
        ),
        (
            "runtime.agent",
            "from runtime.engine.episode import Episode\n",
            "authoring imports the engine",
        ),
        (
            "runtime.storage.sql.sqlite",
            "from runtime.service import access\n",
            "storage imports the service",
        ),
        (
            "threadline_client.client",
            "from runtime.domain import Role\n",
            "the client imports the runtime",
        ),
        ("realtime.hub", "from server.live import inbox\n", "realtime imports the server"),
        (
            "threadline_wire.send_answer",
            "from runtime.domain import Admission\n",
            "the wire models import the runtime (the client could not use them)",
        ),
        (
            "server.protocol.answers",
            "from threadline_client.models import Admission\n",
            "the server imports the client",
        ),
        (
            "runtime.mcp.pool",
            "from runtime.engine.streaming import ChunkSink\n",
            "an MCP tool source imports the engine",
        ),
        (
            "runtime.agent",
            "from runtime.mcp.pool import MCPPool\n",
            "authoring imports the MCP client machinery",
        ),
    ],
)
def test_a_deliberate_wrong_import_is_refused(module: str, source: str, why: str) -> None:
    """The contract fails on a wrong import: each of these, added to the module, is refused."""
    layer = layer_of(module)
    assert layer is not None
    edges = [
        (f"{module}:{line}", layer, target)
        for line, name in imported_modules(source, module, False)
        if (target := imported_layer(name)) is not None and target != layer
    ]
    assert edges and forbidden_edges(edges), why


def test_no_cycles_between_layers() -> None:
    graph: dict[str, set[str]] = {layer: set() for layer in ALLOWED}
    for _, source, target in layer_imports():
        graph[source].add(target)

    def reaches(start: str, goal: str, seen: frozenset[str] = frozenset()) -> bool:
        return any(
            nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt}))
            for nxt in graph[start]
        )

    cycles = [layer for layer in ALLOWED if reaches(layer, layer)]
    assert cycles == [], f"layers on an import cycle: {cycles} ({graph})"


def test_file_names_are_unique() -> None:
    """One name, one meaning: no two modules of the packages share a file name."""
    seen: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if path.name != "__init__.py":
                seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


@pytest.mark.parametrize(
    "path", sorted((ROOT / "examples").glob("*.py")), ids=lambda path: path.name
)
def test_examples_import_only_the_public_api(path: Path) -> None:
    """An example uses `from runtime import ...` (and realtime's package API), never a module
    inside them: what it needs belongs in the public API."""
    module, is_package = module_name(path)
    deep = [
        f"{path.name}:{line}: {name}"
        for line, name in imported_modules(path.read_text(), module, is_package)
        if name.split(".")[0] in PACKAGES
        and name not in ("runtime", "realtime", "threadline_client")
    ]
    assert deep == []


def test_the_public_api_exports_what_it_lists() -> None:
    import importlib.util

    import runtime

    assert len(set(runtime.__all__)) == len(runtime.__all__)
    eager = [name for name in runtime.__all__ if name not in runtime._LAZY]
    assert [name for name in eager if name not in vars(runtime)] == []
    # Lazy names are checked without importing them (the vendor SDKs take seconds): the module
    # they name must define or import the name at top level.
    for name, module in runtime._LAZY.items():
        assert name in runtime.__all__
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None
        tree = ast.parse(Path(spec.origin).read_text())
        defined = {
            getattr(node, "name", None) for node in tree.body if isinstance(node, ast.ClassDef)
        } | {
            alias.asname or alias.name
            for node in tree.body
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
        }
        assert name in defined, f"{module} does not define {name}"
    assert "OpenAICompatModel" not in vars(runtime)  # still lazy after `import runtime`


def test_every_hook_documents_its_spec_row_and_composition_rule() -> None:
    import inspect

    from runtime.compose import _ComposedLifecycle
    from runtime.lifecycle import AgentLifecycle

    hooks = [name for name, _ in inspect.getmembers(AgentLifecycle, inspect.isfunction)]
    assert len(hooks) == 11, hooks  # the spec's phases that are hooks
    for name in hooks:
        doc = inspect.getdoc(getattr(AgentLifecycle, name)) or ""
        assert "Spec:" in doc and "Composed:" in doc, f"AgentLifecycle.{name} docstring"
        # A hook the composite does not override would silently run only the base no-op.
        assert name in vars(_ComposedLifecycle), f"compose_lifecycle does not compose {name}"


def test_every_public_lifecycle_type_is_exported() -> None:
    import inspect

    import runtime
    import runtime.lifecycle

    declared = [
        name
        for name, value in vars(runtime.lifecycle).items()
        if not name.startswith("_")
        and getattr(value, "__module__", None) == "runtime.lifecycle"
        and inspect.isclass(value)
    ]
    assert declared
    assert [name for name in declared if name not in runtime.__all__] == []


def test_runtime_modules_do_not_import_the_public_api() -> None:
    """`runtime/__init__.py` imports the modules; one of them importing a name from `runtime`
    back would be a cycle that works or breaks depending on which module a process imports
    first. `from runtime import telemetry` (a submodule) is fine."""
    submodules = {path.stem for path in (ROOT / "runtime").glob("*.py")} | {
        path.parent.name for path in (ROOT / "runtime").glob("*/__init__.py")
    }
    offenders = []
    for path in sorted((ROOT / "runtime").rglob("*.py")):
        if path == ROOT / "runtime" / "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names if alias.name == "runtime"]
            elif isinstance(node, ast.ImportFrom) and node.module == "runtime" and not node.level:
                names = [alias.name for alias in node.names if alias.name not in submodules]
            else:
                continue
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno}: {name}" for name in names]
    assert offenders == []
