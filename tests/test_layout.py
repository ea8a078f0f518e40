"""Tier 1: the shape of the package (docs/design.md, "Modules").

The layers are folders (protocol, core, server, user, debug, launch; the
conformance suite beside them), imports run only downwards, function-local
and ``TYPE_CHECKING`` imports included, and no module imports itself back
through others. Only the server layer touches ZeroMQ (the client-side
modules that drive a kernel from outside are named below). Every module
says where it runs, stays under 700 lines, and every public definition has
a docstring. Read from the source with ``ast``; nothing is imported.
"""

from __future__ import annotations

import ast
import pathlib
from collections import defaultdict

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "trikernel"

#: Layer of each top-level name, lowest first. A module may import its own
#: layer and any lower one; ``server`` and ``user`` are siblings: neither
#: imports the other (the launch layer wires them together).
LAYERS: dict[str, int] = {
    "__init__": 0,
    "errors": 0,
    "threads": 0,
    "protocol": 1,
    "core": 2,
    "server": 3,
    "user": 3,
    "debug": 4,
    "launch": 5,
    "__main__": 6,
    "conformance": 6,
}

#: Modules that drive a kernel from outside, as a client does (a
#: jupyter_client provisioner, the conformance suite's raw client): their
#: ZeroMQ sockets are the client's, not the kernel's.
CLIENT_SIDE = ("trikernel.launch.provisioner", "trikernel.conformance")

MAX_LINES = 700
MAX_TOP_LEVEL_MODULES = 8


def modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports_of(name: str, path: pathlib.Path, known: dict[str, pathlib.Path]) -> set[str]:
    """Every trikernel module ``name`` imports, anywhere in its body."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()

    def resolve(target: str) -> None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "trikernel":
                    resolve(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != "trikernel":
                continue
            for alias in node.names:
                full = f"{module}.{alias.name}"
                resolve(full if full in known else module)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def layer(name: str) -> tuple[str, int]:
    parts = name.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    assert top in LAYERS, f"{name}: not in a known layer (LAYERS)"
    return top, LAYERS[top]


def test_no_import_cycle() -> None:
    g = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in g:
        if v not in index:
            visit(v)
    assert cycles == []


def test_imports_run_only_downwards() -> None:
    upward = []
    for name, deps in graph().items():
        top, rank = layer(name)
        for dep in deps:
            dep_top, dep_rank = layer(dep)
            if dep_rank > rank or (dep_rank == rank and dep_top != top):
                upward.append(f"{name} -> {dep}")
    assert upward == []


def test_only_the_server_touches_zeromq() -> None:
    touching = []
    for name, path in modules().items():
        if name.startswith(CLIENT_SIDE) or name.startswith("trikernel.server"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            if any(n.split(".")[0] == "zmq" for n in names):
                touching.append(name)
    assert touching == []


def test_the_core_imports_neither_zmq_nor_ipython_nor_the_layers_above() -> None:
    for name, path in modules().items():
        if not name.startswith("trikernel.core"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                for m in mods:
                    assert m.split(".")[0] not in ("zmq", "IPython", "comm", "debugpy"), (name, m)


def test_modules_are_small_and_few_at_the_top() -> None:
    sizes = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    assert {n: s for n, s in sizes.items() if s > MAX_LINES} == {}
    top = [p.name for p in PACKAGE.glob("*.py")]
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


def test_every_module_says_where_it_runs() -> None:
    missing = []
    for name, path in modules().items():
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if path.name == "__init__.py" and not path.read_text().strip():
            continue
        if "Runs on:" not in doc and "Runs on" not in doc:
            missing.append(name)
    assert missing == []


def public_definitions(path: pathlib.Path) -> list[tuple[str, ast.AST]]:
    """Module-level functions and classes, and methods of public classes,
    whose names do not start with ``_`` (dunders excluded)."""
    tree = ast.parse(path.read_text())
    out: list[tuple[str, ast.AST]] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and not node.name.startswith("_"):
            out.append((node.name, node))
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and not item.name.startswith("_"):
                        out.append((f"{node.name}.{item.name}", item))
    return out


def _overrides(node: ast.AST) -> bool:
    decorators = getattr(node, "decorator_list", [])
    return any(isinstance(d, ast.Name) and d.id == "override" for d in decorators)


def test_every_public_definition_has_a_docstring() -> None:
    undocumented = defaultdict(list)
    for name, path in modules().items():
        for qualname, node in public_definitions(path):
            if ast.get_docstring(node) is None and not _overrides(node):  # type: ignore[arg-type]
                undocumented[name].append(qualname)
    assert dict(undocumented) == {}


@pytest.mark.parametrize("layer_name", ["protocol", "core", "server", "user", "debug", "launch"])
def test_each_layer_is_a_folder(layer_name: str) -> None:
    assert (PACKAGE / layer_name / "__init__.py").is_file()
