"""Import contracts: the package layering and the examples' public-API rule, on every import."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("runtime", "realtime", "server")
# What each package may import of the others; anything not listed is forbidden.
ALLOWED: dict[str, frozenset[str]] = {
    "realtime": frozenset(),
    "runtime": frozenset({"realtime"}),
    "server": frozenset({"runtime", "realtime"}),
}


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


def package_imports() -> list[tuple[str, str, str]]:
    """(importing file:line, importing package, imported package) across the three packages."""
    edges = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            module, is_package = module_name(path)
            for line, name in imported_modules(path.read_text(), module, is_package):
                target = name.split(".")[0]
                if target in PACKAGES and target != package:
                    where = f"{path.relative_to(ROOT)}:{line}"
                    edges.append((where, package, target))
    return edges


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
    found = [name for _, name in imported_modules(source, "runtime.providers.base", False)]
    assert sorted(found) == [
        "realtime.bus",
        "runtime.outer",
        "runtime.providers",
        "runtime.storage",
        "server",
    ]
    init = [name for _, name in imported_modules("from . import x\n", "runtime.demo", True)]
    assert init == ["runtime.demo"]


def test_packages_import_only_what_the_layering_allows() -> None:
    edges = package_imports()
    assert edges, "the walk found no cross-package import at all: it is looking in the wrong place"
    forbidden = [
        f"{where}: {source} imports {target}"
        for where, source, target in edges
        if target not in ALLOWED[source]
    ]
    assert forbidden == []


def test_no_cycles_between_packages() -> None:
    graph: dict[str, set[str]] = {package: set() for package in PACKAGES}
    for _, source, target in package_imports():
        graph[source].add(target)

    def reaches(start: str, goal: str, seen: frozenset[str] = frozenset()) -> bool:
        return any(
            nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt}))
            for nxt in graph[start]
        )

    cycles = [package for package in PACKAGES if reaches(package, package)]
    assert cycles == [], f"packages on an import cycle: {cycles} ({graph})"


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
        if name.split(".")[0] in PACKAGES and name not in ("runtime", "realtime")
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
