"""geomjax's modules form one-way layers: every import (function-level ones included),
parsed from the source, goes from a module to one in its own layer or a lower one, and no
set of modules imports itself in a circle. Function-level imports in the core are few,
each with a one-line reason (a comment on it or just above it)."""

import ast
import pathlib

import geomjax

ROOT = pathlib.Path(geomjax.__file__).parent

#: Lowest first. A module belongs to the first entry that is its name or a package above it.
LAYERS = (
    ("leaves", ("geomjax._version", "geomjax._labels", "geomjax._config", "geomjax._status",
                "geomjax._validate", "geomjax.internal")),
    ("solves", ("geomjax._solve",)),
    ("systems", ("geomjax._monitored", "geomjax._system")),
    ("fields", ("geomjax._field",)),
    ("steps", ("geomjax._step",)),
    ("stability", ("geomjax._stability",)),
    ("driver", ("geomjax._driver",)),
    ("uses", ("geomjax._tuning", "geomjax._analysis", "geomjax.diagnostics", "geomjax.models")),
    ("learning", ("geomjax._learning",)),
    ("top", ("geomjax.experiments", "geomjax._caches", "geomjax._cli", "geomjax.__main__", "geomjax")),
)
#: The packages below the experiments and the command line: at most this many
#: function-level imports there.
MAX_CORE_FUNCTION_IMPORTS = 10


def _modules():
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = ("geomjax",) + path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _owner(name: str) -> str:
    """The module `name` denotes: itself, or the nearest enclosing one that exists."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _imports(module: str, path: pathlib.Path):
    """(target module, line, at function level, line text, line above) for every import of geomjax."""
    source = path.read_text()
    lines = source.splitlines()
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names if a.name.split(".")[0] == "geomjax"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base.split(".")[0] != "geomjax":
                continue
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for target in targets:
            target = _owner(target)
            if target != module:
                above = lines[node.lineno - 2] if node.lineno > 1 else ""
                yield target, node.lineno, node.col_offset > 0, lines[node.lineno - 1], above


def _layer(module: str) -> int:
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes if p != "geomjax"):
            return index
    assert module in ("geomjax",), f"{module} is in no layer: add it to LAYERS"
    return len(LAYERS) - 1


EDGES = {m: list(_imports(m, p)) for m, p in MODULES.items()}


def test_every_module_is_in_a_layer():
    for module in MODULES:
        _layer(module)


def test_no_import_runs_from_a_lower_layer_to_a_higher_one():
    upward = [
        f"{m}:{line} imports {t} ({LAYERS[_layer(m)][0]} → {LAYERS[_layer(t)][0]})"
        for m, edges in EDGES.items()
        for t, line, *_ in edges
        if _layer(t) > _layer(m)
    ]
    assert not upward, "\n".join(upward)


def test_no_import_circle():
    graph = {m: {t for t, *_ in edges} for m, edges in EDGES.items()}
    state, stack, circles = {}, [], []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                circles.append(" → ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not circles, "\n".join(circles)


def test_function_level_imports_in_the_core_are_few_and_give_their_reason():
    top = dict(LAYERS)["top"]
    found = [
        (m, line, text, above)
        for m, edges in EDGES.items()
        if m != "geomjax" and not any(m == p or m.startswith(p + ".") for p in top if p != "geomjax")
        for _, line, nested, text, above in edges
        if nested
    ]
    assert len(found) <= MAX_CORE_FUNCTION_IMPORTS, found
    unexplained = [f"{m}:{line}" for m, line, text, above in found
                   if "#" not in text and not above.strip().startswith("#")]
    assert not unexplained, unexplained


def test_the_parser_sees_a_planted_upward_import(tmp_path, monkeypatch):
    """The checks above can fail: a field module importing the driver inside a function
    is found (as upward, and as function-level)."""
    planted = tmp_path / "planted.py"
    planted.write_text("def f():\n    from .._driver.integrate import integrate\n    return integrate\n")
    edges = list(_imports("geomjax._field.planted", planted))
    assert edges and edges[0][0] == "geomjax._driver.integrate" and edges[0][2]
    assert _layer(edges[0][0]) > _layer("geomjax._field.planted")
