"""The import structure of deinsum/: declared layers, imports only downward, no circles.

Every module (found by walking the files, imports read with ``ast`` wherever
they appear, function bodies included) must be in :data:`LAYERS`; a module
may import only modules of its own or a lower layer, and the import graph has
no circle.
"""
import ast
from pathlib import Path

import deinsum
from deinsum.emit import runtime_files

PACKAGE = Path(deinsum.__file__).parent

#: Lowest first. A name covers that module or package and everything below it ("deinsum" is the
#: package's own __init__ only).
LAYERS = [
    ["deinsum.errors", "deinsum.version", "deinsum.memory", "deinsum.options",   # leaves: errors only
     "deinsum.peak"],                        # (numpy only: a footprint's bytes, run-time half)
    ["deinsum.decompose"],                   # front end: grammar, binary steps
    ["deinsum.soap"],                        # bounds
    ["deinsum.layout"],                      # layouts and block arithmetic
    ["deinsum.grids", "deinsum.placement"],  # the grid search; where tensors are placed
    ["deinsum.tables"],                      # moves: each rank's exchange tables (emitted scripts carry them)
    ["deinsum.redistribute"],                # moves: their volume model and the decisions a plan takes once
    ["deinsum.schedule", "deinsum.footprint"],  # typed schedule entries, a plan's peak memory per rank
    ["deinsum.plan", "deinsum.runtime"],     # the one immutable Plan; beside it the run-time wing
    ["deinsum.emit"],                        # the script generator
    ["deinsum.darray_numpy", "deinsum.darray"],  # distributed arrays (layouts + the exchange), numpy's protocols
    ["deinsum.program"],                     # the compiled program
    ["deinsum.sequence"],                    # plans for a repeated sequence of programs
    ["deinsum", "deinsum.cli"],              # the API and the command line
]
#: Wings of one layer that must not reach into each other: the runtime runs plans, it never makes one.
APART = [("deinsum.plan", "deinsum.runtime")]



def module_name(path: Path) -> str:
    parts = ("deinsum",) + path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The deinsum modules ``name`` imports anywhere in its file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[:len(base) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def layer_of(name: str) -> int:
    best = None
    for level, entries in enumerate(LAYERS):
        for entry in entries:
            covers = name == entry or (entry != "deinsum" and name.startswith(entry + "."))
            if covers and (best is None or len(entry) > len(best[1])):
                best = (level, entry)
    assert best is not None, f"{name} is in no layer: declare it in LAYERS"
    return best[0]


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def violations() -> set[str]:
    found = modules()
    graph = {name: imports(name, path, set(found)) for name, path in found.items()}
    bad = {f"upward: {a} -> {b}" for a, targets in graph.items() for b in targets if layer_of(b) > layer_of(a)}
    bad |= {"circle: " + ", ".join(c) for c in circles(graph)}
    covered = lambda name, entry: name == entry or name.startswith(entry + ".")
    bad |= {f"across wings: {a} -> {b}" for a, targets in graph.items() for b in targets for one, other in APART
            if (covered(a, one) and covered(b, other)) or (covered(a, other) and covered(b, one))}
    return bad


def test_imports_point_down_and_make_no_circle():
    bad = violations()
    assert not bad, f"layering violations: {sorted(bad)}"


def test_the_walk_sees_relative_and_function_level_imports():
    found = modules()
    names = set(found)
    assert "deinsum.program" in imports("deinsum", found["deinsum"], names)       # inside compile()
    assert "deinsum.runtime.exchange" in imports("deinsum.runtime.runner", found["deinsum.runtime.runner"], names)
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_runtime_modules_are_standalone():
    """Emitted scripts carry them: numpy, mpi4py, the standard library and each other only."""
    allowed = {"numpy", "mpi4py", "threadpoolctl", "pytblis", "cupy", "cupyx", "cupy_backends", "ctypes", "glob", "argparse",
               "itertools", "math", "os", "re", "sys", "functools", "contextlib", "errno", "signal", "socket", "stat",
               "threading",
               "base64", "json", "linecache", "bz2", "time",
               "hashlib", "importlib", "tempfile", "__future__", "dataclasses", "typing"}
    for device in ("cpu", "gpu"):   # a script for the CPU carries no GPU code: nothing it runs imports it
        for blocks in (False, True):   # nor one of whole inputs and result the block I/O
            _check_carried(runtime_files(device, blocks), allowed)


def _check_carried(files, allowed):
    carried = {module_name(PACKAGE / path) for path in files}
    for path in (*files, "runtime/bundle.py"):
        name = module_name(PACKAGE / path)
        package = name.rpartition(".")[0]
        for node in ast.walk(ast.parse((PACKAGE / path).read_text())):
            if isinstance(node, ast.Import):
                assert {a.name.split(".")[0] for a in node.names} <= allowed, (path, ast.dump(node))
            elif isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                targets = [node.module] if node.module else [alias.name for alias in node.names]
                assert all(".".join(base + [t]) in carried for t in targets), (path, ast.dump(node))   # carried
            elif isinstance(node, ast.ImportFrom):
                assert node.module.split(".")[0] in allowed, (path, ast.dump(node))


def test_no_runtime_module_is_over_500_lines():
    """The run-time wing is split by concern: none of its modules grows past 500 lines."""
    lengths = {path.name: len(path.read_text().splitlines()) for path in (PACKAGE / "runtime").glob("*.py")}
    assert len(lengths) > 10 and max(lengths.values()) <= 500, sorted(lengths.items(), key=lambda kv: -kv[1])[:3]
