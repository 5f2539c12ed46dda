"""The shape of the source tree: imports only point down (no cycles), files and functions stay short."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "nexttok"
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 50


def module_name(path: Path) -> str:
    """module_name(SRC/"nexttok/server/app.py") -> "nexttok.server.app"; __init__ names its package."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The nexttok modules a file imports anywhere in it (top level or inside functions): `from
    nexttok.x import y` counts as nexttok.x.y when that is a module, else nexttok.x."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in known else node.module
                     for alias in node.names]
        else:
            continue
        found |= {name for name in names if name in known}
    return found


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in sources()}
    known = set(modules)
    graph = {}
    for name, path in modules.items():
        edges = imports_of(path, known) - {name}
        # a package's __init__ re-exporting its own submodules is not a cycle with them
        graph[name] = {m for m in edges if not (path.name == "__init__.py" and m.startswith(name + "."))}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle as a list of modules (first == last), or None: find_cycle({"a": {"b"}, "b": {"a"}})
    -> ["a", "b", "a"]."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_finds_cycles_and_accepts_trees():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_import_graph_sees_function_local_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from nexttok.x import y\n    import nexttok.z\n")
    assert imports_of(module, {"nexttok.x", "nexttok.x.y", "nexttok.z"}) == {"nexttok.x.y", "nexttok.z"}


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 20 and any(graph.values())  # the walk really saw the package
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_files_and_functions_stay_short(path: Path):
    text = path.read_text(encoding="utf-8")
    lines = text.count("\n")
    assert lines <= MAX_FILE_LINES, f"{path.name} has {lines} lines (at most {MAX_FILE_LINES})"
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
            for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{path.name}: functions over {MAX_FUNCTION_LINES} lines: {', '.join(long)}"


# The pipeline's layers, lowest first: a module imports only from its own layer or those below it
# (README, "Architecture"). Within a layer, packages do not import each other.
LAYERS = [
    ("nexttok.errors", "nexttok.home", "nexttok.cpu"),
    ("nexttok.tokenizers",),
    ("nexttok.models",),
    ("nexttok.checkpoints",),
    ("nexttok.generation",),
    ("nexttok.parallel",),
    ("nexttok.lesson",),
    ("nexttok.server",),
    ("nexttok.benchmark",),
    ("nexttok.bench_native",),  # against llama.cpp's own tools, over benchmark's measurements
    ("nexttok.bench_streams",),  # nexttok serve against llama-server, N streams at once (over bench_native)
    ("nexttok.cli",),
    ("nexttok.__main__", "nexttok"),  # the entry point and the package's public names
]


def unit_of(module: str) -> tuple[int, str]:
    """(layer, unit) of a module: unit_of("nexttok.models.llama") == (2, "nexttok.models")."""
    best = None
    for layer, units in enumerate(LAYERS):
        for unit in units:
            if (module == unit or module.startswith(unit + ".")) and (best is None or len(unit) > len(best[1])):
                best = (layer, unit)
    assert best is not None, f"{module} is in no layer: add its package to LAYERS (and the README)"
    return best


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports that point up a layer or across to another unit of the same layer."""
    found = []
    for module, imported in sorted(graph.items()):
        layer, unit = unit_of(module)
        for target in sorted(imported):
            their_layer, their_unit = unit_of(target)
            if their_layer > layer or (their_layer == layer and their_unit != unit):
                found.append(f"{module} -> {target}")
    return found


def test_layering_finds_an_upward_import():
    assert layering_violations({"nexttok.models.llama": {"nexttok.generation.loop"}}) == [
        "nexttok.models.llama -> nexttok.generation.loop"]
    assert layering_violations({"nexttok.errors": {"nexttok.home"}}) == ["nexttok.errors -> nexttok.home"]
    assert layering_violations({"nexttok.server.app": {"nexttok.models.cache", "nexttok.errors"}}) == []


def test_every_import_points_down_the_pipeline():
    """Function-local imports included: a lazy import may not climb a layer either."""
    assert layering_violations(import_graph()) == []


def test_no_module_imports_another_modules_private_name():
    known = {module_name(p) for p in sources()}
    found = []
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module in known and node.module != module_name(path):
                found += [f"{module_name(path)}: {node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_") and f"{node.module}.{a.name}" not in known]
    assert found == []


def test_every_architecture_provides_the_whole_model_protocol():
    """What callers use is declared in models/protocol.py, and every architecture has all of it:
    nothing needs a getattr or hasattr probe."""
    import inspect

    from nexttok.models import ARCHITECTURES
    from nexttok.models.protocol import Model

    declared = set(Model.__annotations__) | {name for name, _ in inspect.getmembers(Model, inspect.isfunction)
                                             if not name.startswith("_")}
    instance_only = {"config", "compiled"}  # set in __init__
    assert {"tie_weights", "init_buffers", "CHECKPOINT_PREFIX", "PARALLEL_VOCAB", "position_table"} <= declared
    for kind, entry in ARCHITECTURES.items():
        cls = entry.model
        missing = sorted(name for name in declared - instance_only if not hasattr(cls, name))
        assert missing == [], f"{kind} ({cls.__name__}) lacks {missing}"
