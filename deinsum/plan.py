"""The one immutable Plan: groups, grids, layouts and every data movement.

Planning is pure (no MPI): a Plan can be built for any number of ranks. The
report, the in-process runtime and the emitted script all read it.

>>> from deinsum.decompose import decompose
>>> plan = build_plan(decompose("ij,jk->ik", (64, 64), (64, 64)), nprocs=8, inputs="local", result="distributed")
>>> plan.groups[0].grid.used, [m.label for m in plan.moves]
(8, ['in0: distribute', 'in1: distribute'])
>>> [int(b) for b in plan.received_bytes()] == [received for _, received in plan.model_bytes()]
True
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .decompose import Decomposition, Step
from .errors import DeinsumError
from .grids import GridChoice, Layout, plan_grid
from .schedule import Compute, Move
from .soap import analyze

INPUT_MODES = {"global": "global arrays on every rank", "root": "global arrays on rank 0",
               "local": "evenly block-distributed local blocks, no replication"}
RESULT_MODES = {"all": "whole result on every rank", "root": "whole result on rank 0",
                "distributed": "evenly block-distributed"}
#: Default local memory per rank, in elements, for the SOAP bounds (1 GiB of float64).
DEFAULT_MEMORY = 2**27


_MODE_LAYOUTS = {"global": Layout.replicated, "all": Layout.replicated, "root": Layout.on_root,
                 "local": Layout.even, "distributed": Layout.even}


def mode_layout(mode: str, shape: tuple[int, ...], nprocs: int) -> Layout:
    """The layout of an input or result mode: on every rank, on rank 0, or evenly block-distributed.

    >>> mode_layout("root", (3, 4), 2) == Layout.on_root((3, 4), 2)
    True
    """
    return _MODE_LAYOUTS[mode](shape, nprocs)


@dataclass(frozen=True)
class GroupPlan:
    """One fused group of binary steps, run on one Cartesian grid."""

    index: int
    steps: tuple[Step, ...]
    grid: GridChoice
    reads: tuple[tuple[str, str], ...]   # (tensor, subscripts) coming from outside the group
    output: str
    output_subscripts: str

    @property
    def indices(self) -> str:
        return self.grid.indices


@dataclass(frozen=True, eq=False)
class Plan:
    """Everything needed to run (or emit) one einsum on ``nprocs`` ranks."""

    decomposition: Decomposition
    nprocs: int
    dtype: np.dtype
    memory: int
    inputs: str
    result: str
    analysis: object
    groups: tuple[GroupPlan, ...]
    entry: tuple[Layout, ...]
    exit: Layout
    schedule: tuple[Move | Compute, ...]   # in order

    @property
    def equation(self) -> str:
        return self.decomposition.equation

    @property
    def moves(self) -> tuple[Move, ...]:
        return tuple(item for item in self.schedule if isinstance(item, Move))

    def received_bytes(self) -> np.ndarray:
        """Modeled bytes every rank receives (from the volume model: fast for any number of ranks)."""
        return sum((m.words_received for m in self.moves), np.zeros(self.nprocs, dtype=np.int64)) * self.dtype.itemsize

    def model_bytes(self) -> list[tuple[int, int]]:
        """Predicted (bytes sent, bytes received) of every rank, from the exchange tables."""
        return self._model_bytes

    @cached_property
    def _model_bytes(self) -> list[tuple[int, int]]:
        size = self.dtype.itemsize
        return [(sum(m.redistribution.bytes_sent(r, size) for m in self.moves),
                 sum(m.redistribution.bytes_received(r, size) for m in self.moves)) for r in range(self.nprocs)]

    def __str__(self) -> str:
        d = self.decomposition
        lines = [f"deinsum plan for {d.equation!r} on {self.nprocs} rank(s), dtype {self.dtype.name}",
                 f"  inputs: {INPUT_MODES[self.inputs]}; result: {RESULT_MODES[self.result]}",
                 f"  local memory for the SOAP bounds: S = {self.memory} elements",
                 str(d), ""]
        for g in self.groups:
            ops = "; ".join(s.operation for s in g.steps)
            dims = ", ".join(f"{c}={p}" for c, p in zip(g.indices, g.grid.dims))
            lines.append(f"  group {g.index}: {ops}")
            lines.append(f"    grid ({dims}) on {g.grid.used} of {self.nprocs} ranks"
                         + (f"; {g.grid.idle} idle: {g.grid.reason}" if g.grid.idle else ""))
        lines.append("")
        lines.append("  data movement (bytes per rank, max over ranks):")
        for m in self.moves:
            lines.append(f"    {m.label:<32} {int(m.words_received.max()) * self.dtype.itemsize:>14,}")
        received = self.received_bytes()
        lines.append(f"  total received per rank: max {int(received.max()):,} bytes, "
                     f"mean {float(received.mean()):,.0f}")
        return "\n".join(lines)


def _holds_blocks(src: Layout, dst: Layout, nprocs: int) -> bool:
    """Whether every rank already holds exactly its ``dst`` block in ``src`` (complete sums): no move needed.

    >>> _holds_blocks(Layout.on_root((3, 4), 1), Layout.even((3, 4), 1), 1)
    True
    """
    if src.partial or min(src.nranks, nprocs) != min(dst.nranks, nprocs):
        return False
    (src_lo, src_hi), (dst_lo, dst_hi) = src.boxes(nprocs), dst.boxes(nprocs)
    return bool(np.array_equal(src_lo, dst_lo) and np.array_equal(src_hi, dst_hi))


def _group_reads(steps: tuple[Step, ...]) -> tuple[tuple[str, str], ...]:
    produced = {s.name for s in steps}
    reads = []
    for s in steps:
        for name, sub in zip(s.operands, s.subscripts):
            if name not in produced:
                reads.append((name, sub))
    return tuple(reads)


def build_plan(decomposition: Decomposition, nprocs: int, dtype=np.float64, memory: int | None = None,
               inputs: str = "global", result: str = "all") -> Plan:
    """Plan ``decomposition`` on ``nprocs`` ranks (pure; no MPI needed)."""
    d = decomposition
    if d.sizes is None:
        raise DeinsumError("a run plan needs concrete sizes: pass operand shapes")
    if not isinstance(nprocs, (int, np.integer)) or nprocs < 1:
        raise DeinsumError(f"nprocs must be an integer >= 1, not {nprocs!r}")
    if inputs not in INPUT_MODES:
        raise DeinsumError(f"inputs={inputs!r}: expected one of {', '.join(INPUT_MODES)}")
    if result not in RESULT_MODES:
        raise DeinsumError(f"result={result!r}: expected one of {', '.join(RESULT_MODES)}")
    if inputs == "local" and d.prepass:
        names = ", ".join(s.operands[0] for s in d.prepass)
        raise DeinsumError(f"operand(s) {names} need a unary pre-pass (diagonal, sum or broadcast): "
                           f"pass global arrays (inputs='global' or 'root')")
    dtype = np.dtype(dtype)
    memory = DEFAULT_MEMORY if memory is None else int(memory)
    sizes = d.sizes
    shape_of = lambda sub: tuple(sizes[c] for c in sub)  # noqa: E731

    layouts = {name: mode_layout(inputs, shape_of(sub), nprocs)
               for name, sub in zip(d.input_names, d.input_subscripts)}
    entry = tuple(layouts[n] for n in d.input_names)
    analysis = analyze(d, S=memory, P=nprocs) if d.steps else None
    schedule, groups, made_by = [], [], {}
    # a group runs once its last step can: ordering by last step is a topological order
    ordered = sorted(analysis.groups, key=lambda b: max(b.steps)) if analysis else []
    for g, bound in enumerate(ordered):
        steps = tuple(d.steps[k] for k in sorted(bound.steps))
        tile = bound.parallel.tiles
        reads = _group_reads(steps)
        last = steps[-1]
        is_last = g == len(ordered) - 1
        target = mode_layout(result, shape_of(last.output), nprocs) if is_last else None
        choice = plan_grid(bound.statement.variables, sizes, tuple(sub for _, sub in reads), last.output, nprocs,
                           tile=tile, sources=tuple(layouts[name] for name, _ in reads), target=target)
        for name, sub in reads:
            dst = choice.layout(sub, sizes, partial=False)
            src = layouts[name]
            if not _holds_blocks(src, dst, nprocs):
                phase = "distribute" if name in d.input_names else ("reduce" if src.partial else "redistribute")
                schedule.append(Move(name, phase, src, dst, nprocs, made_by.get(name)))
            layouts[name] = dst
        group = GroupPlan(g, steps, choice, reads, last.name, last.output)
        groups.append(group)
        schedule.append(Compute(group))
        made_by[last.name] = g
        layouts[last.name] = choice.layout(last.output, sizes, partial=True)
    if not d.steps:  # a single operand: the pre-pass makes the result where the operand is
        layouts["out"] = mode_layout(inputs, shape_of(d.output), nprocs)
    final = mode_layout(result, shape_of(d.output), nprocs)
    src = layouts["out"]
    if not _holds_blocks(src, final, nprocs):
        phase = "gather" if result != "distributed" else "reduce" if src.partial else "redistribute"
        schedule.append(Move("out", phase, src, final, nprocs, made_by.get("out")))
    return Plan(d, int(nprocs), dtype, memory, inputs, result, analysis, tuple(groups), entry, final,
                tuple(schedule))

