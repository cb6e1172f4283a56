"""Emit a Plan as a standalone, readable mpi4py program whose size does not grow with the ranks.

The program is the plan's data as Python literals (layouts, not tables), the
schedule as straight-line code: one function per fused group that moves what
the group reads (``rt.scatter``, ``rt.reduce_scatter``, ..., each on its named
communicator) and runs its local steps, and ``run`` that calls them in order;
and, as one delimited block, the definitions it uses from the modules in
:data:`RUNTIME` (layouts, the per-rank exchange tables, kernels, exchange,
runtime, driver), their lines verbatim but indented by half, without
docstrings and comments. Each rank builds its own exchange tables and
footprint from the layouts at start-up, so the size does not depend on the
number of ranks (MTTKRP 64^3 x 8 on rank 0: about 60 kB at P = 8 and at
P = 65,536). ``Program.__call__`` runs the same schedule through the same
modules in-process.

Nothing from the user reaches the code except through ``repr`` of plain data
(strings, ints, tuples) and comments; tensor names are checked against a
fixed pattern.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .errors import DeinsumError
from .footprint import footprint_terms
from .schedule import Move
from .version import __version__

#: The modules (under deinsum/) an emitted script carries, in dependency order.
RUNTIME = ("errors.py", "layout.py", "redistribute.py", "runtime/kernels.py", "runtime/exchange.py",
           "memory.py", "runtime/checks.py", "footprint.py", "runtime/gpu.py",
           "runtime/runner.py", "runtime/driver.py")
#: What the driver (and the test harness that runs a script's own code) reaches besides the listing.
ENTRY = ("script_main", "exit_with", "script_runtime", "validation_operands")
BEGIN = "# " + "=" * 30 + " BEGIN deinsum runtime " + "=" * 30
END = "# " + "=" * 30 + " END deinsum runtime " + "=" * 32
_NAME = re.compile(r"^(in\d+|t\d+|out)$")


def _name(name: str) -> str:
    """A tensor name usable as an identifier in the program (never user text)."""
    if not _NAME.match(name):
        raise DeinsumError(f"internal tensor name {name!r} is not a valid program identifier")
    return name


_WORD = re.compile(r"(\.\s*)?\b([A-Za-z_]\w*)")
#: Python's tokens as far as the carrier needs them: strings (with any prefix), comments, names, dots,
#: brackets, backslash continuations and line ends; everything else is skipped.
_TOKEN = re.compile(r"""(?P<string>(?:[rRbBuUfF]{1,2}(?=['"]))?(?:'\'\'(?:\\.|[^\\])*?'\'\'|\"\"\"(?:\\.|[^\\])*?\"\"\"
                                  |'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*"))
                      |(?P<comment>\#[^\n]*)|(?P<name>[A-Za-z_]\w*)|(?P<dot>\.)|(?P<open>[(\[{])|(?P<close>[)\]}])
                      |(?P<backslash>\\(?=\n))|(?P<newline>\n)""", re.X)


@dataclass(frozen=True)
class _Def:
    """A top-level statement (or a method) of a carried module: the names it defines (none: always kept),
    its lines, and the names (``x``) and attributes (``.x``) its code mentions."""

    names: tuple[str, ...]
    lines: range
    names_used: frozenset
    attrs_used: frozenset
    methods: tuple = ()


@dataclass(frozen=True)
class _Module:
    """A carried module's lines, its definitions, and the lines no program keeps (docstrings, comments,
    blank lines, imports of other deinsum modules; ``replace``: an emptied body's ``pass``; ``inside``:
    lines inside a multi-line string; ``cut``: the spaces a line loses, half its statement's indentation;
    ``trim``: where a line's inline comment starts)."""

    lines: tuple[str, ...]
    defs: tuple[_Def, ...]
    drop: frozenset
    replace: dict
    inside: frozenset
    cut: dict
    trim: dict


def _body_docstrings(body, drop: set, replace: dict, top: bool = False) -> None:
    """Mark the docstrings of ``body`` and of the definitions nested in it."""
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        drop.update(range(first.lineno, first.end_lineno + 1))
        if len(body) == 1 and not top:
            replace[first.lineno] = " " * first.col_offset + "pass"
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            _body_docstrings(node.body, drop, replace)


def _first_line(node) -> int:
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", ())])


@lru_cache(maxsize=None)
def _module(text: str) -> _Module:
    """Index one carried module (cached: every emission reads the same files)."""
    tree = ast.parse(text)
    lines = tuple(text.splitlines())
    drop, replace = set(), {}
    _body_docstrings(tree.body, drop, replace, top=True)
    inside = set()   # lines inside multi-line strings keep their blanks and hashes
    words: dict[int, list] = {}   # per line, the (is_attribute, name) of its identifiers
    cut: dict[int, int] = {}   # per line, the spaces it loses: half its statement's indentation
    trim: dict[int, int] = {}  # per line, where an inline comment starts
    line, depth, dot, joined = 1, 0, False, False
    cut[1] = 0
    for match in _TOKEN.finditer(text):
        kind, value = match.lastgroup, match.group()
        if kind == "newline":
            line += 1
            if depth or joined:   # a continuation line moves with its statement
                cut[line] = cut[line - 1]
            else:
                indent = len(lines[line - 1]) - len(lines[line - 1].lstrip(" ")) if line <= len(lines) else 0
                cut[line] = indent - indent // 2
            joined = False
            continue
        if kind == "string":
            if "f" in value.split(value[-1])[0].lower():   # an f-string: the names in its expressions
                words.setdefault(line, []).extend((bool(d), w) for d, w in _WORD.findall(value))
            end = line + value.count("\n")
            inside.update(range(line + 1, end + 1))
            cut.update((n, cut[line]) for n in range(line + 1, end + 1))
            line = end
        elif kind == "comment":
            column = match.start() - text.rfind("\n", 0, match.start()) - 1
            if lines[line - 1][:column].strip():
                trim[line] = column          # an inline comment: the code before it stays
            else:
                drop.add(line)
        elif kind == "name":
            words.setdefault(line, []).append((dot, value))
        elif kind == "open" or kind == "close":
            depth += 1 if kind == "open" else -1
        joined = kind == "backslash"
        dot = kind == "dot"
    drop.update(n for n, line in enumerate(lines, 1) if not line.strip() and n not in inside)

    def define(node, names, skip=()) -> _Def:
        span = range(_first_line(node), node.end_lineno + 1)
        found = [w for n in span if n not in drop and n not in skip for w in words.get(n, ())]
        return _Def(tuple(names), span, frozenset(w for is_attr, w in found if not is_attr),
                    frozenset(w for is_attr, w in found if is_attr))

    defs = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.level or node.module == "__future__") or (
                isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "__all__"):
            drop.update(range(node.lineno, node.end_lineno + 1))
            continue
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)]
        else:
            names = []
        entry = define(node, names)
        if isinstance(node, ast.ClassDef):
            methods = tuple(define(part, [part.name]) for part in node.body if isinstance(part, ast.FunctionDef))
            rest = define(node, names, skip=set().union(*(m.lines for m in methods)))
            entry = _Def(rest.names, rest.lines, rest.names_used, rest.attrs_used, methods)
        defs.append(entry)
    return _Module(lines, tuple(defs), frozenset(drop), replace, frozenset(inside), cut, trim)


def _kept(modules, roots: set[str]) -> set[tuple[int, range]]:
    """The (module number, line span) of the definitions reachable from the names ``roots`` (to a fixed
    point): a top-level definition when a kept one mentions its name, a method when one mentions it as an
    attribute (or its class's own code by name), dunder methods with their class."""
    names, attrs, kept = set(roots), set(roots), set()
    while True:
        before = len(names) + len(attrs)
        for k, module in enumerate(modules):
            for d in module.defs:
                if d.names and not set(d.names) & names:
                    continue
                kept.add((k, d.lines))
                names |= d.names_used
                attrs |= d.attrs_used
                for m in d.methods:
                    if m.names[0] in attrs or m.names[0] in d.names_used or m.names[0].startswith("__"):
                        kept.add((k, m.lines))
                        names |= m.names_used
                        attrs |= m.attrs_used
        if len(names) + len(attrs) == before:
            return kept


def _lines(module: _Module, kept: set[range]) -> list[str]:
    """The module's lines that the program keeps (``kept``: the line spans of its kept definitions),
    indented by half (a continuation line moves with its statement; lines inside multi-line strings stay
    as they are)."""
    out = []
    for d in module.defs:
        if d.lines not in kept:
            continue
        skip = set().union(*(m.lines for m in d.methods if m.lines not in kept))
        for n in d.lines:
            line = module.replace.get(n, module.lines[n - 1])
            if n in module.trim and n not in module.replace:
                line = line[:module.trim[n]].rstrip()
            if (n in module.drop or n in skip) and n not in module.replace:
                continue
            if n in module.inside:
                out.append(line)
            else:
                out.append(line[min(module.cut.get(n, 0), len(line) - len(line.lstrip(" "))):])
    return out


def runtime_source(roots=ENTRY) -> str:
    """The definitions of the :data:`RUNTIME` modules reachable from the names ``roots`` as one block:
    their lines verbatim, without docstrings, comments (inline ones too), blank lines and their imports of
    each other."""
    package = Path(__file__).parent
    modules = [_module((package / m).read_text()) for m in RUNTIME]
    kept = _kept(modules, set(roots) | set(ENTRY))
    parts = [BEGIN, f"# deinsum {__version__}: what this program uses of deinsum/{{{', '.join(RUNTIME)}}},",
             "# their lines verbatim (indented by half), without docstrings, comments and imports of each other"]
    imported = set()   # each import once
    for k, (name, module) in enumerate(zip(RUNTIME, modules)):
        parts.append(f"# ---- {name}")
        for line in _lines(module, {lines for n, lines in kept if n == k}):   # (spans of other files may coincide)
            if line.startswith(("import ", "from ")):
                if line in imported:
                    continue
                imported.add(line)
            parts.append(line)
    parts.append(END)
    return "\n".join(parts)


def _comment_block(text: str) -> str:
    return "\n".join(("# " + line).rstrip() for line in text.splitlines())


def _layouts(plan) -> dict:
    """Every layout the data names (moves, footprint), numbered in order of first use: ``{layout: "L<k>"}``."""
    held, transients = footprint_terms(plan)
    names: dict = {}
    for layout in [x for m in plan.moves for x in (m.src, m.dst)] + [term[0] for group in (held, *transients)
                                                                        for term in group]:
        names.setdefault(layout, f"L{len(names)}")
    return names


def _literal(layout) -> str:
    """``layout`` as positional Python source."""
    partial = f", {layout.partial!r}" if layout.partial else ""
    return f"Layout({layout.shape!r}, {layout.grid!r}, {layout.axes!r}{partial})"


def generate(plan, device: str = "cpu") -> str:
    """The program's source text (see module docstring); with ``device='gpu'`` it also carries the GPU path
    (:mod:`deinsum.runtime.gpu`) and runs there with ``--device gpu``."""
    d = plan.decomposition
    shapes = [tuple(d.sizes[c] for c in s) for s in d.raw_subscripts]
    sizes = {c: d.sizes[c] for c in sorted(set("".join(d.raw_subscripts)))}
    header = [
        "#!/usr/bin/env python3",
        f"# Generated by deinsum {__version__}. Needs only numpy and mpi4py.",
        f"# Run: mpiexec -n {plan.nprocs} python -m mpi4py THIS_FILE [--size i=N] [--load a.npy ...] "
        "[--save out.npy] [--validate] [--repeat K] [--memory BYTES]" + (" [--device gpu]" if device == "gpu" else ""),
        "#",
        _comment_block(str(plan)),
        "from __future__ import annotations",
    ]
    held, transients = footprint_terms(plan)
    names = _layouts(plan)

    def terms(group):
        return "".join(f"\n        ({names[layout]}, {word}, {holder}, {cut!r})," for layout, word, holder, cut in group)

    data = [
        f"# {'=' * 20} the plan's data {'=' * 20}",
        f"EQUATION = {d.equation!r}",
        f"NPROCS = {plan.nprocs!r}",
        f"DTYPE = {plan.dtype.name!r}",
        f"INPUTS = {plan.inputs!r}",
        f"RESULT = {plan.result!r}",
        f"SIZES = {sizes!r}",
        f"INPUT_SHAPES = {shapes!r}",
        "OPEN_DEVICE = open_device  # --device gpu runs the local contractions with CuPy" if device == "gpu" else
        "OPEN_DEVICE = None  # emitted for the CPU (emit with device='gpu' for --device gpu)",
        "# the layouts: Layout(shape, grid, axes[, partial]); axes[x] = the grid dimension(s) splitting axis x",
        "\n".join(f"{name} = {_literal(layout)}" for layout, name in names.items()),
        "# MOVES[k] = (timer, label, source layout, destination layout, split, rounds) of move k, from which every",
        "# rank builds its own exchange tables at start-up (split: None, or how a reduce-scatter first cuts each",
        "# block; rounds: None, or (axis, T): T steps, each bringing one round's part of the block along axis)",
        "MOVES = [" + "".join(f"\n    ({m.phase!r}, {m.label!r}, {names[m.src]}, {names[m.dst]}, "
                              f"{m.redistribution.split!r}, {m.rounds!r})," for m in plan.moves) + "\n]",
        "# peak bytes per rank (an upper bound), checked against --memory before any work: the held terms plus",
        "# the largest transient, each term (layout, words per element of its block, words where it holds one,",
        "# (axis, rounds) where one round's part of the block counts)",
        "FOOTPRINT = (\n    (" + terms(held) + "\n    ),\n    (" + "".join(
            f"\n        ({', '.join(f'({names[layout]}, {w}, {h}, {c!r})' for layout, w, h, c in group)},),"
            for group in transients) + "\n    ),\n)",
    ]
    for g in plan.groups:
        data.append(f"GRID{g.index} = {tuple(g.grid.dims)!r}  # ({', '.join(g.indices)})")
    footer = ["if __name__ == '__main__':", "    exit_with(script_main(globals()))", ""]
    program = "\n\n".join(["\n".join(data), _listing(plan), "\n".join(footer)])
    runtime = runtime_source({w for _, w in _WORD.findall(program)})
    return "\n\n".join(["\n".join(header), runtime, program])


def _listing(plan) -> str:
    """One function per group (the moves into it, then its local steps) and ``run`` calling them."""
    d = plan.decomposition
    index = {id(m): k for k, m in enumerate(plan.moves)}
    functions, body, pending = [], [], []
    for item in plan.schedule:
        if isinstance(item, Move):
            pending.append(item)
            continue
        g = item.group
        reads = ", ".join(_name(name) for name, _ in g.reads)
        functions.append(_group_function(g, [(m, index[id(m)]) for m in pending], reads))
        body.append(f"    {_name(g.output)} = group{g.index}(rt, {reads})")
        pending = []
    body += [line for m in pending for line in _move_lines(m, index[id(m)])]
    names = ", ".join(_name(n) for n in d.input_names)
    run = [f"def run(rt, {names}):",
           f'    """{plan.nprocs} ranks: inputs {plan.inputs}, result {plan.result}. Each argument is this rank\'s',
           "    block of an input as the plan's entry layouts hold it (None where it holds none).",
           '    """']
    run += [f"    {_name(s.name)} = rt.unary({_name(s.operands[0])}, {s.subscripts[0]!r}, {s.output!r})"
            for s in d.prepass]
    run += body + ["    return out"]
    return "\n\n\n".join(functions + ["\n".join(run)]) + "\n"


def _group_function(g, moves, reads) -> str:
    grid = f"GRID{g.index}"
    dims = ", ".join(f"{c}={p}" for c, p in zip(g.indices, g.grid.dims))
    lines = [f"def group{g.index}(rt, {reads}):",
             f'    """{"; ".join(s.operation for s in g.steps)} on grid {g.index} ({dims}), {g.grid.used} rank(s)'
             + (f"; {g.grid.idle} idle" if g.grid.idle else "") + '."""']
    if g.rounds:
        lines += _round_lines(g, moves, grid)
    else:
        for m, k in moves:
            lines += _move_lines(m, k)
        lines.append(f"    if rt.member({grid}):")
        lines.append(f"        {_name(g.output)} = rt.contract_group({tuple(sub for _, sub in g.reads)!r}, "
                     f"{g.output_subscripts!r}, {reads})  # {', '.join(s.kind for s in g.steps)}")
        lines += ["    else:", f"        {_name(g.output)} = None"]
    split = [g.indices[k] for k in g.grid.reduction_dims if g.grid.dims[k] > 1]
    lines.append(f"    return {_name(g.output)}" + (f"  # partial sums over ({', '.join(split)})" if split else ""))
    return "\n".join(lines)


def _round_lines(g, moves, grid) -> list[str]:
    """A group in rounds: each round brings its part of the moved blocks (one step of their moves), takes
    its part of the blocks held in place, and adds its partial result into the group's."""
    index, count = g.rounds
    rounded = {m.tensor: (m, k) for m, k in moves if m.rounds}
    lines = [line for m, k in moves if not m.rounds for line in _move_lines(m, k)]
    lines += [f"    # {m.label}: {m.src} -> {m.dst}, one part along axis {m.rounds[0]} per round"
              for m, _ in rounded.values()]
    out, parts = _name(g.output), []
    lines += [f"    {out} = None", f"    for t in range({count}):  # rounds over {index}: the sum of their results"]
    for name, sub in g.reads:
        if name in rounded:
            m, k = rounded[name]
            e = m.exchanges[0]
            comm = "rt.world" if e.comm.group is None else e.comm.name
            if e.comm.group is not None:
                lines.append(f"        {comm} = rt.cart_sub(GRID{e.comm.group}, remain={e.comm.remain!r})")
            lines.append(f"        {_name(name)}_t = rt.{e.kind}({_name(name)}, move={k}, step=t, comm={comm})")
        elif index in sub:
            lines.append(f"        {_name(name)}_t = rt.slab({_name(name)}, {sub.index(index)}, {count}, t)")
        parts.append(f"{_name(name)}_t" if name in rounded or index in sub else _name(name))
    lines.append(f"        {out} = rt.contract_round({grid}, {out}, {tuple(sub for _, sub in g.reads)!r}, "
                 f"{g.output_subscripts!r}, {', '.join(parts)})  # {', '.join(s.kind for s in g.steps)}")
    lines.append(f"        del {', '.join(p for p in parts if p.endswith('_t'))}")
    return lines


def _move_lines(move, k) -> list[str]:
    """One named collective per step of the move, each on its communicator."""
    t = _name(move.tensor)
    lines = [f"    # {move.label}: {move.src} -> {move.dst}"]
    for s, e in enumerate(move.exchanges):
        comm = "rt.world"
        if e.comm.group is not None:
            comm = e.comm.name
            lines.append(f"    {comm} = rt.cart_sub(GRID{e.comm.group}, remain={e.comm.remain!r})")
        step = f", step={s}" if s else ""
        lines.append(f"    {t} = rt.{e.kind}({t}, move={k}{step}, comm={comm})")
    return lines
