"""Emit a Plan as a standalone, readable mpi4py program whose size does not grow with the ranks.

The program is the plan's data as Python literals (layouts as tuples, not
tables), the schedule as straight-line code: one function per fused group that
moves what the group reads (``rt.scatter``, ``rt.reduce_scatter``, ..., each on
its named communicator, a comment naming the MPI call that runs it) and runs its local steps, and ``run`` that calls them in
order; then the runtime it runs on: the package files of :data:`RUNTIME`, byte
for byte, as one compressed payload that the script imports from itself
(:mod:`deinsum.runtime.bundle`, whose text comes first, verbatim). Each rank
builds its own exchange tables and footprint from the layouts at start-up, so
the size does not depend on the number of ranks. ``Program.__call__`` runs the
same schedule through the same modules in-process.

Nothing from the user reaches the code except through ``repr`` of plain data
(strings, ints, tuples) and comments; tensor names are checked against a
fixed pattern.
"""
from __future__ import annotations

import bz2
import re
from functools import lru_cache
from pathlib import Path

from .errors import DeinsumError
from .footprint import footprint_terms
from .runtime.bundle import DIGITS, package_name
from .schedule import Move, Prepass
from .version import __version__

#: The package files (under deinsum/) an emitted script carries, byte for byte (one emitted for the GPU also
#: carries :data:`GPU_RUNTIME`; one whose inputs are local or result distributed, :data:`BLOCK_RUNTIME`).
RUNTIME = ("errors.py", "memory.py", "layout.py", "tables.py", "peak.py", "runtime/__init__.py",
           "runtime/exchange.py", "runtime/libraries.py", "runtime/cost.py", "runtime/gemm.py", "runtime/blas.py",
           "runtime/mttkrp.py", "runtime/ttm.py", "runtime/kernels.py", "runtime/checks.py", "runtime/runner.py",
           "runtime/driver.py")
GPU_RUNTIME = ("runtime/gpu.py",)
BLOCK_RUNTIME = ("runtime/npyio.py",)
#: What the driver (and the test harness that runs a script's own code) takes from the runtime.
ENTRY = ("exit_with", "script_main", "script_runtime", "validation_operands")
#: The line that opens the runtime's part of a script.
RUNTIME_MARK = "# " + "=" * 20 + " the runtime " + "=" * 20
_NAME = re.compile(r"^(in\d+|t\d+|out)$")
_PACKAGE = Path(__file__).parent


def _name(name: str) -> str:
    """A tensor name usable as an identifier in the program (never user text)."""
    if not _NAME.match(name):
        raise DeinsumError(f"internal tensor name {name!r} is not a valid program identifier")
    return name


def runtime_files(device: str = "cpu", blocks: bool = False) -> tuple[str, ...]:
    """The package files a script emitted for ``device`` carries (with ``blocks``, the block I/O of local inputs
    and distributed results too)."""
    return RUNTIME + (GPU_RUNTIME if device == "gpu" else ()) + (BLOCK_RUNTIME if blocks else ())


def pack(files):
    """``{path under deinsum/: text}`` as a payload (text) that :func:`deinsum.runtime.bundle.install` imports:
    a NUL before each path and text, bzip2 (a few % below LZMA on this text), zero bytes up to a multiple of 40,
    each 40 as 49 digits.

    >>> from deinsum.runtime.bundle import install
    >>> package = install(pack({"errors.py": "X = 1\\n"}))
    >>> __import__(package + ".errors", fromlist=["X"]).X
    1
    """
    assert not any("\0" in path + text for path, text in files.items())
    data = bz2.compress("".join(f"\0{path}\0{text}" for path, text in files.items()).encode(), 9)
    data += bytes(-len(data) % 40)
    numbers = (int.from_bytes(data[k:k + 40], "big") for k in range(0, len(data), 40))
    return "".join(DIGITS[n // 93 ** e % 93] for n in numbers for e in range(48, -1, -1))


@lru_cache(maxsize=4)
def runtime_payload(device: str = "cpu", blocks: bool = False) -> str:
    """The :func:`runtime_files` as one payload (:func:`pack`; read once per process)."""
    return pack({path: (_PACKAGE / path).read_text() for path in runtime_files(device, blocks)})


def runtime_part(device: str = "cpu", blocks: bool = False) -> str:
    """The script's runtime: :mod:`deinsum.runtime.bundle` verbatim, the payload, its installation and the
    imports of the entry points (and, with ``device='gpu'``, of ``open_device``; with ``blocks``, of the block
    I/O module as ``BLOCK_IO``)."""
    payload, files = runtime_payload(device, blocks), runtime_files(device, blocks)
    package = package_name(payload)
    width = 12_000   # a few long lines: 7 bytes of quotes and indent per line
    chunks = "\n".join(f'    "{payload[k:k + width]}"' for k in range(0, len(payload), width))
    lines = [RUNTIME_MARK, f"# deinsum {__version__}'s package files, byte for byte (bzip2, base 93) in RUNTIME:",
             *(f"#   {', '.join(files[k:k + 6])}" for k in range(0, len(files), 6)),
             f"# imported from there as the package {package} by the code of runtime/bundle.py, verbatim:",
             (_PACKAGE / "runtime" / "bundle.py").read_text().rstrip("\n"),
             "", "", f"RUNTIME = (\n{chunks}\n)",
             f"install(RUNTIME, 'deinsum {__version__}')",
             f"from {package}.runtime.driver import {', '.join(ENTRY)}  # noqa: E402"]
    if device == "gpu":
        lines.append(f"from {package}.runtime.gpu import open_device as OPEN_DEVICE  # noqa: E402")
    if blocks:
        lines.append(f"from {package}.runtime import npyio as BLOCK_IO  # noqa: E402")
    harness = ["run", "script_runtime", "validation_operands"] + (["OPEN_DEVICE"] if device == "gpu" else []) + (
        ["BLOCK_IO"] if blocks else [])
    lines.append(f"__all__ = {harness!r}   # what the driver and a test harness take from this module")
    return "\n".join(lines)


def _comment_block(text: str) -> str:
    return "\n".join(("# " + line).rstrip() for line in text.splitlines())


def _layouts(plan) -> dict:
    """Every layout the data names (moves, footprint), numbered in order of first use: ``{layout: "L<k>"}``."""
    names: dict = {}
    for layout in [x for m in plan.moves for x in (m.src, m.dst)] + [p.src for p in plan.prepasses] + [
            term[0] for held, transients in footprint_terms(plan) for group in (held, *transients) for term in group
    ] + [*plan.entry, plan.exit]:
        names.setdefault(layout, f"L{len(names)}")
    return names


def _literal(layout) -> str:
    """``layout`` as a tuple literal ``(shape, grid, axes, partial)`` (the driver makes the Layout)."""
    return repr((layout.shape, layout.grid, layout.axes, layout.partial))


def generate(plan, device: str = "cpu") -> str:
    """The program's source text (see module docstring); with ``device='gpu'`` it also carries the GPU path
    (:mod:`deinsum.runtime.gpu`) and runs there with ``--device gpu``; with local inputs or a distributed result
    it carries the block I/O (:mod:`deinsum.runtime.npyio`)."""
    d = plan.decomposition
    blocks = plan.inputs == "local" or plan.result == "distributed"
    shapes = list(d.raw_shapes)
    sizes = {c: d.sizes[c] for c in sorted(set("".join(d.raw_subscripts)))}
    header = [
        "#!/usr/bin/env python3",
        f"# Generated by deinsum {__version__}. Needs only numpy and mpi4py.",
        f"# Run: mpiexec -n {plan.nprocs} python -m mpi4py THIS_FILE [--size i=N] [--load a.npy ...] "
        "[--save out.npy] [--validate] [--repeat K] [--memory BYTES]" + (" [--device gpu]" if device == "gpu" else ""),
        "#",
        _comment_block(plan.text(bounds=False) + "\n  (its lower bounds: deinsum plan, with the same sizes, P, modes and memory)"),
        "from __future__ import annotations",
    ]
    names = _layouts(plan)

    def terms(group):
        """A tuple of footprint terms, as many on a line as 120 columns hold."""
        lines = [""]
        for text in (f"({names[layout]}, {w}, {h}, {c!r})," for layout, w, h, c in group):
            if lines[-1] and 13 + len(lines[-1]) + len(text) > 120:
                lines.append("")
            lines[-1] += (" " if lines[-1] else "") + text
        return "(" + "\n            ".join(lines) + ")"

    def phase(held, transients):
        return (f"\n    (\n        {terms(held)},\n        (" + "".join(f"\n            {terms(group)},"
                                                                      for group in transients) + "\n        ),\n    ),")

    data = [
        f"# {'=' * 20} the plan's data {'=' * 20}",
        f"EQUATION = {d.equation!r}",
        f"NPROCS = {plan.nprocs!r}",
        f"DTYPE = {plan.dtype.name!r}",
        f"INPUTS = {plan.inputs!r}",
        f"RESULT = {plan.result!r}",
        f"SIZES = {sizes!r}",
        f"INPUT_SHAPES = {shapes!r}",
        "# --device gpu runs the local contractions with CuPy: OPEN_DEVICE comes with the runtime" if device == "gpu"
        else "OPEN_DEVICE = None  # emitted for the CPU (emit with device='gpu' for --device gpu)",
        "# local inputs or a distributed result: each rank reads and writes its blocks with BLOCK_IO (runtime)"
        if blocks else "BLOCK_IO = None  # whole inputs and result: no block I/O carried",
        "# layouts (shape, grid, axes, partial): axes[x] the grid dimension(s) splitting axis x, partial those summed over",
        "\n".join(f"{name} = {_literal(layout)}" for layout, name in names.items()),
        f"ENTRY = [{', '.join(names[layout] for layout in plan.entry)}]  # where the inputs start, {plan.inputs}",
        f"EXIT = {names[plan.exit]}  # where the result ends, {plan.result}",
        "# MOVES[k] = (timer, label, source, destination, split, rounds): each rank builds its exchange tables",
        "# from them at start-up; split: how a reduce-scatter first cuts each block; rounds: (axis, T), T steps",
        "# each bringing one round's or part's share of the block along axis (None: no split, one step)",
        "MOVES = [" + "".join(f"\n    ({m.phase!r}, {m.label!r}, {names[m.src]}, {names[m.dst]}, "
                              f"{m.redistribution.split!r}, {m.rounds or m.parts!r})," for m in plan.moves) + "\n]",
        "# peak bytes per rank (an upper bound) checked against --memory first: per group (held, transients), the most of",
        "# all held so far plus its largest transient; a term: (layout, words per element of its block, words where it",
        "# holds one, (axis, T) where one round's part counts)",
        "FOOTPRINT = (" + "".join(phase(held, transients) for held, transients in footprint_terms(plan)) + "\n)",
    ]
    for g in plan.groups:
        data.append(f"GRID{g.index} = {tuple(g.grid.dims)!r}  # ({', '.join(g.indices)})")
    footer = ["if __name__ == '__main__':", "    exit_with(script_main(globals()))", ""]
    return "\n\n\n".join(["\n".join(header), "\n".join(data), _listing(plan).rstrip("\n"), runtime_part(device, blocks),
                           "\n".join(footer)])


def _listing(plan) -> str:
    """One function per group (the moves into it, then its local steps) and ``run`` calling them."""
    d = plan.decomposition
    index = {id(m): k for k, m in enumerate(plan.moves)}
    layouts = _layouts(plan)
    functions, body, pending = [], [], []
    for item in plan.schedule:
        if isinstance(item, Move):
            pending.append(item)
            continue
        if isinstance(item, Prepass):   # on every rank's block, after the moves that align it
            s = item.step
            body += [line for m in pending for line in _move_lines(m, index[id(m)])]
            body.append(f"    {_name(s.name)} = rt.unary({_name(s.operands[0])}, {s.subscripts[0]!r}, {s.output!r}, "
                        f"{layouts[item.src]})  # {s.kind}" + (f", partial sums over grid {item.dst.partial}"
                                                             if item.dst.partial else ""))
            pending = []
            continue
        g = item.group
        reads = ", ".join(_name(name) for name, _ in g.reads)
        functions.append(_group_function(g, [(m, index[id(m)]) for m in pending], reads,
                                         layouts[g.result_block(d.sizes)]))
        body.append(f"    {_name(g.output)} = group{g.index}(rt, {reads})")
        pending = []
    body += [line for m in pending for line in _move_lines(m, index[id(m)])]
    names = ", ".join(_name(n) for n in d.input_names)
    run = [f"def run(rt, {names}):",
           f'    """{plan.nprocs} ranks: inputs {plan.inputs}, result {plan.result}. Each argument is this rank\'s',
           "    block of an input as the plan's entry layouts hold it (None where it holds none).",
           '    """']
    run += body + ["    return out"]
    return "\n\n\n".join(functions + ["\n".join(run)]) + "\n"


def _group_function(g, moves, reads, block: str) -> str:
    """Group ``g``'s function: the ``moves`` into it, its local steps (in rounds: a loop); ``block`` names the
    layout of its result blocks."""
    grid = f"GRID{g.index}"
    dims = ", ".join(f"{c}={p}" for c, p in zip(g.indices, g.grid.dims))
    lines = [f"def group{g.index}(rt, {reads}):",
             f'    """{"; ".join(s.operation for s in g.steps)} on grid {g.index} ({dims}), {g.grid.used} rank(s)'
             + (f"; {g.grid.idle} idle" if g.grid.idle else "") + '."""']
    if g.rounds:
        lines += _round_lines(g, moves, grid, block)
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


def _round_lines(g, moves, grid, block) -> list[str]:
    """A group in rounds: each round brings its part of the moved blocks (one step of their moves), takes
    its part of the blocks held in place, and adds its partial result into the group's (over a summed index)
    or makes that slab of it (over a free index: the blocks without the index moved once, before the loop)."""
    index, count = g.rounds
    rounded = {m.tensor: (m, k) for m, k in moves if m.rounds}
    lines = [line for m, k in moves if not m.rounds for line in _move_lines(m, k)]
    lines += [f"    # {m.label}: {m.src} -> {m.dst}, one part along axis {m.rounds[0]} per round"
              for m, _ in rounded.values()]
    out, parts = _name(g.output), []
    what = "slab t of the result" if g.free_rounds else "the sum of their results"
    lines += [f"    {out} = None", f"    for t in range({count}):  # {g.rounds_text}: {what}"]
    for name, sub in g.reads:
        if name in rounded:
            m, k = rounded[name]
            e = m.exchanges[0]
            comm, made = _communicator(e, "        ")
            lines += made + [f"        {_name(name)}_t = rt.prefetch({e.kind!r}, {_name(name)}, move={k}, step=t, "
                             f"steps={count}, comm={comm})" + (f"  # MPI_I{e.mpi.lower()}, round t + 1's posted before "
                                                               f"round t computes" if e.mpi else _mpi(e))
                             if m.prefetch else
                             f"        {_name(name)}_t = rt.{e.kind}({_name(name)}, move={k}, step=t, comm={comm})"
                             + _mpi(e)]
        elif index in sub:
            lines.append(f"        {_name(name)}_t = rt.slab({_name(name)}, {sub.index(index)}, {count}, t)")
        parts.append(f"{_name(name)}_t" if name in rounded or index in sub else _name(name))
    call = (f"rt.contract_slab({block}, {out}, {g.output_subscripts.index(index)}, {count}, t, " if g.free_rounds
            else f"rt.contract_round({grid}, {out}, ")
    lines.append(f"        {out} = {call}{tuple(sub for _, sub in g.reads)!r}, "
                 f"{g.output_subscripts!r}, {', '.join(parts)})  # {', '.join(s.kind for s in g.steps)}")
    lines.append(f"        del {', '.join(p for p in parts if p.endswith('_t'))}")
    return lines


def _move_lines(move, k) -> list[str]:
    """One named collective per step of the move, each on its communicator."""
    t = _name(move.tensor)
    lines = [f"    # {move.label}: {move.src} -> {move.dst}"]
    for s, e in enumerate(move.exchanges):
        comm, made = _communicator(e, "    ")
        lines += made
        step = f", step={s}" if s else ""
        if move.parts:   # its steps are the parts of one reduction, placed into the destination block
            axis, parts = move.parts
            lines.append(f"    {t} = rt.in_parts({e.kind!r}, {t}, move={k}, axis={axis}, parts={parts}, comm={comm})"
                         + _mpi(e))
        else:
            lines.append(f"    {t} = rt.{e.kind}({t}, move={k}{step}, comm={comm})" + _mpi(e))
    return lines


def _mpi(exchange) -> str:
    """The comment that says what MPI runs for an exchange step."""
    return f"  # MPI_{exchange.mpi}" if exchange.mpi else "  # no MPI call: a local slice"


def _communicator(exchange, indent: str) -> tuple[str, list[str]]:
    """The name of the communicator an exchange runs on, and the line that makes it (a Cart_sub) if any."""
    comm = exchange.comm
    if comm.world:
        return "rt.world", []
    grid = comm.grid if comm.group is None else f"GRID{comm.group}"
    return comm.name, [f"{indent}{comm.name} = rt.cart_sub({grid}, remain={comm.remain!r})"]
