"""The package's layering: no module imports a module of a higher layer, and no cycles.

The layers read DESIGN §1's pipeline as a building: plain data contracts at the ground, the
stages that turn one contract into another above them, the applications on top. Every import
counts, function-level (lazy) ones included: a lazy import up the stack is still a dependency
on a higher layer. The package face (``opdvfs/__init__.py``) re-exports lazily and is not a
layer; only the applications may import from it.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "opdvfs"

#: Bottom-up. A module may import modules of its own unit or of any lower layer.
LAYERS: list[tuple[str, ...]] = [
    ("exceptions", "datasets", "_lazy", "_means"),
    ("_files", "_table"),
    ("_model",),
    # data contracts: what flows between the stages
    ("devices", "profile"),
    ("workloads.workload", "calibration", "schedule", "result"),
    # stages below the planner: files -> Profile, Profile -> models, the simulated device
    ("io", "models", "sim", "workloads"),
    # models -> Schedule; Schedule -> RunResult (actuators, the executor)
    ("plan", "runtime"),
    # applications: the closed loop on a running program, then the simulator experiments
    ("tuner",),
    ("integrations",),
    ("experiments",),
    ("report",),
    ("cli",),
    ("__main__",),
]


def unit_of(module: str) -> str:
    """The most specific entry of :data:`LAYERS` that ``module`` (dotted, no ``opdvfs.``) is in."""
    best = ""
    for layer in LAYERS:
        for unit in layer:
            if (module == unit or module.startswith(unit + ".")) and len(unit) > len(best):
                best = unit
    if not best:
        raise AssertionError(f"opdvfs.{module} is in no layer: add it to LAYERS")
    return best


def layer_of(module: str) -> int:
    unit = unit_of(module)
    return next(i for i, layer in enumerate(LAYERS) if unit in layer)


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports_of(path: Path) -> set[str]:
    """Every ``opdvfs`` module ``path`` imports, anywhere in the file ('' for the face)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
            # ``from opdvfs.sim import presets`` imports the submodule when there is one
            names += [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            if name == "opdvfs":
                out.add("")
            elif name.startswith("opdvfs."):
                out.add(name.removeprefix("opdvfs."))
    known = set(modules())
    # keep the longest name that is a module (``opdvfs.sim.presets.get_preset`` -> sim.presets)
    resolved = set()
    for name in out:
        while name and name not in known:
            name = name.rpartition(".")[0]
        resolved.add(name)
    return resolved


def edges() -> dict[str, set[str]]:
    return {
        name: imports_of(path) - {name}
        for name, path in modules().items()
        if name  # the face itself
    }


def test_every_module_is_in_a_layer():
    for name in modules():
        if name:
            unit_of(name)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Each import from a module to one of the same or a higher layer (other units)."""
    upward = []
    for name, targets in graph.items():
        for target in targets:
            if target == "":
                if layer_of(name) < layer_of("cli"):
                    upward.append(f"opdvfs.{name} imports the package face `opdvfs`")
                continue
            same_unit = unit_of(name) == unit_of(target)
            if not same_unit and layer_of(target) >= layer_of(name):
                upward.append(
                    f"opdvfs.{name} (layer {layer_of(name)}) imports opdvfs.{target} "
                    f"(layer {layer_of(target)})"
                )
    return sorted(upward)


def test_no_import_runs_up_a_layer():
    assert not upward_imports(edges()), "\n".join(upward_imports(edges()))


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (depth-first search), or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done

    def visit(node: str, stack: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt, [*stack, nxt])):
                return cycle
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node, [node])):
            return cycle
    return None


def test_no_import_cycle():
    cycle = find_cycle({name: {t for t in targets if t} for name, targets in edges().items()})
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_check_catches_an_upward_import(tmp_path):
    """The walker sees lazy imports and ``from pkg import submodule``; the rule flags them."""
    path = tmp_path / "m.py"
    path.write_text(
        "def f():\n    from opdvfs.plan import planner\n    import opdvfs.cli._app\n"
        "from opdvfs.sim.presets import get_preset\n"
    )
    assert imports_of(path) == {"plan", "plan.planner", "cli._app", "sim.presets"}
    # what the simulator once did: import the planner's data object
    assert upward_imports({"sim.twin": {"plan.schedule", "schedule"}}) == [
        "opdvfs.sim.twin (layer 5) imports opdvfs.plan.schedule (layer 6)"
    ]
    assert upward_imports({"io.ascend": {"models.perf"}})  # same layer, other unit
    assert upward_imports({"models.power": {""}})  # the face
    assert not upward_imports({"plan.planner": {"plan.dp", "models.bundle", "schedule"}})
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
