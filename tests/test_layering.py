"""The package's import structure (docs/design.md, "Layout"): imports point down
the layers, and no module imports itself back through others.

The imports are read from the source (`ast`), function-level ones included
(a lazy import is still a dependency); imports under ``if TYPE_CHECKING:``
are not run and do not count.
"""

import ast
import functools
import pathlib

import pytest

import dcjax

ROOT = pathlib.Path(dcjax.__file__).parent

#: docs/design.md's layers, lowest first: a top-level module or subpackage of
#: dcjax imports only from its own layer or lower ones. Unlisted: layer 6.
LAYERS = {
    **dict.fromkeys(("_loops", "_compact", "_checks", "_compat", "allocator"), 1),
    **dict.fromkeys(("kernels", "matching", "video", "models"), 2),
    "transforms": 3,
    "config": 4,
    "semantic": 5,
    "eval": 7,
    "bench": 8,
    "cli": 9,
}
TOP = ("__init__", "__main__")  # the package's front doors import anything


def _module_name(path: pathlib.Path) -> str:
    parts = ("dcjax",) + path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path) -> set[str]:
    """What ``path`` imports from dcjax at run time, as dotted names: a module
    (``import dcjax.x``) or a name in one (``from dcjax.x import y``: ``dcjax.x.y``,
    which may be a module or a name defined in ``dcjax.x``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "dcjax")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "dcjax":
                found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


@functools.cache
def _graph() -> dict[str, frozenset[str]]:
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        # `from dcjax.x import y` imports module dcjax.x.y where y is one, else dcjax.x
        deps = {d if d in modules else d.rsplit(".", 1)[0] for d in _imports(path)}
        graph[name] = frozenset(d for d in deps if d != name and d in modules)
    return graph


def _component(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_imports_point_down_the_layers():
    upward = [
        f"{module} (layer {LAYERS.get(_component(module), 6)}) imports {dep} "
        f"(layer {LAYERS.get(_component(dep), 6)})"
        for module, deps in sorted(_graph().items())
        if _component(module) not in TOP
        for dep in sorted(deps)
        if LAYERS.get(_component(dep), 6) > LAYERS.get(_component(module), 6)
    ]
    assert not upward, "\n".join(upward)


def test_no_module_imports_itself_back():
    graph = _graph()
    # the package's __init__ re-exports from below it, and its submodules'
    # `from dcjax import x` name siblings, not the package: drop the package node
    graph = {m: {d for d in ds if d != "dcjax"} for m, ds in graph.items() if m != "dcjax"}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(graph.get(module, ())):
            if state.get(dep) == 1:
                cycles.append(" -> ".join(path[path.index(dep) :] + [dep]))
            elif dep not in state:
                visit(dep, path + [dep])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "\n".join(cycles)


@pytest.mark.parametrize(
    "source, expected",
    [
        ("from dcjax.kernels import tuning\n", {"dcjax.kernels.tuning"}),
        ("import dcjax.race\n", {"dcjax.race"}),
        ("def f():\n    from dcjax import plan\n", {"dcjax.plan"}),
        ("from dcjax.config import Config\n", {"dcjax.config.Config"}),
        (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dcjax import plan\n",
            set(),
        ),
        ("from . import x\nimport numpy\n", set()),
    ],
)
def test_the_reader_finds_run_time_imports_only(tmp_path, source, expected):
    path = tmp_path / "m.py"
    path.write_text(source)
    assert _imports(path) == expected
