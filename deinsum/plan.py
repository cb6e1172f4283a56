"""The one immutable Plan: groups, grids, layouts and every data movement.

Planning is pure (no MPI): a Plan can be built for any number of ranks. The
report, the in-process runtime and the emitted script all read it.

>>> from deinsum.decompose import decompose
>>> plan = build_plan(decompose("ij,jk->ik", (64, 64), (64, 64)), nprocs=8)
>>> plan.groups[0].grid.dims, [m.label for m in plan.moves]
((2, 2, 2), ['in0: distribute', 'in1: distribute', 'out: reduce'])
>>> [int(b) for b in plan.received_bytes()] == [received for _, received in plan.model_bytes()]
True
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from functools import cached_property, reduce
from typing import Mapping

import numpy as np

from .memory import as_bytes, default_memory
from .decompose import Decomposition, Step
from .errors import DeinsumError
from .options import as_ranks, check_choice
from .grids import GridChoice, balanced_split, block_imbalance, candidate_grids, estimate_words
from .layout import Layout, block_range
from .placement import even_layout, pin_layout, spread
from .redistribute import received_words, reduce_split, sample_ranks
from .footprint import footprint, group_terms, moved_term, reduction_staging
from .peak import ROUND_PIECES, SLACK, term_words
from .schedule import Compute, Move, Prepass, unary_layouts
from .soap import analyze
from .soap.parallel import balance_text

INPUT_MODES = {"global": "global arrays on every rank", "root": "global arrays on rank 0",
               "local": "each rank holds one block, no replication; the planner chooses the layout"}
RESULT_MODES = {"all": "whole result on every rank", "root": "whole result on rank 0",
                "distributed": "each rank holds one block, no replication; the planner chooses the layout"}
#: The search plans at most this many fusion candidates (best first by the SOAP analysis).
MAX_PARTITIONS = 16
#: Per group and partial plan, the grids with the best estimates that are scored exactly ...
GRIDS_PER_GROUP = 6
#: ... and the partial plans kept after each group (beam search).
BEAM_WIDTH = 6
#: The search plans again, at most this many times, with less memory where the chosen plan, modeled on every
#: rank, peaks above the memory that the sample ranks fitted.
REPLANS = 2
#: The search models this many sample ranks (all of them up to this count); the chosen plan is
#: modeled on every rank.
SEARCH_RANKS = 256


_MODE_LAYOUTS = {"global": Layout.replicated, "all": Layout.replicated, "root": Layout.on_root}


def mode_layout(mode: str, shape: tuple[int, ...], nprocs: int) -> Layout:
    """The fixed layout of a start or end mode: on every rank or on rank 0 (the planner places
    ``local`` inputs and ``distributed`` results itself).

    >>> mode_layout("root", (3, 4), 2) == Layout.on_root((3, 4), 2)
    True
    """
    return _MODE_LAYOUTS[mode](shape, nprocs)


@dataclass(frozen=True)
class GroupPlan:
    """One fused group of binary steps, run on one Cartesian grid; with ``rounds`` ``(index, T)`` in T
    rounds over one index: each round brings one part of the blocks that hold ``index`` (those without it move
    once, before the rounds, and stay) and, over a summed index, adds its partial result into the group's, over
    a free one (an index of the result) makes that slab of the result (the same words moved, a T-th of those
    blocks held at a time)."""

    index: int
    steps: tuple[Step, ...]
    grid: GridChoice
    reads: tuple[tuple[str, str], ...]   # (tensor, subscripts) coming from outside the group
    output: str
    output_subscripts: str
    rounds: tuple[str, int] | None = None

    @property
    def indices(self) -> str:
        return self.grid.indices

    @property
    def free_rounds(self) -> bool:
        """Whether the group runs in rounds over a free index (its result made slab by slab)."""
        return bool(self.rounds) and self.rounds[0] in self.output_subscripts

    @property
    def rounds_text(self) -> str:
        """``T rounds over <index> (free)`` or ``(summed)``; empty without rounds.

        >>> from deinsum.grids import GridChoice
        >>> GroupPlan(0, (), GridChoice("ijk", (1, 1, 1), "ik", 1), (), "out", "ik", ("i", 4)).rounds_text
        '4 rounds over i (free)'
        """
        if not self.rounds:
            return ""
        return f"{self.rounds[1]} rounds over {self.rounds[0]} ({'free' if self.free_rounds else 'summed'})"

    def result_block(self, sizes) -> Layout:
        """The layout of the group's result blocks on its grid (complete or partial sums: the same blocks)."""
        return self.grid.layout(self.output_subscripts, sizes, partial=False)


@dataclass(frozen=True)
class PlanBound:
    """The per-rank lower bounds a plan is held against, in words received by the busiest rank.

    ``words``: the class bound (``covers`` says its class), the least over contraction paths and fusion
    candidates of the sum of group bounds (connected groups by their joint bound where more), at least what the
    copies of a replicated result cost;
    ``per_group``: the bound of each group of the chosen plan; ``candidates``:
    ``(partition, bound, modeled words or None: not planned, or left once it could not beat the chosen)`` of
    every fusion candidate of the plan's path (joint
    bounds counted where they could decide the least); ``atomic``: the whole einsum as
    one statement (:attr:`ATOMIC`); ``chosen_words``: the chosen fusion's, with all its
    joint bounds. All hold under :attr:`assumptions`, for any memory per rank: within ``rho``, the plan's own
    balance (:attr:`Plan.balance`), so they cover the plan they are printed with.
    """

    words: float
    per_group: tuple[float, ...]
    candidates: tuple[tuple[tuple[tuple[int, ...], ...], float, int | None], ...]
    binding: str
    atomic: float
    chosen_words: float
    covers: str = ""                     # the class (:attr:`deinsum.soap.Analysis.covers`)
    fits: tuple[bool | None, ...] = ()   # per candidate: whether its scored plan fits the memory (None: not scored)
    rho: float = 1.0                     # the balance assumed: the plan's own (:attr:`Plan.balance`)

    CHOSEN = "this plan's path and fusion"
    ATOMIC = "atomic bound: one-statement algorithms only (the whole einsum as one fused statement)"
    #: The assumptions besides balance (:attr:`assumptions`).
    ASSUMPTIONS = ("each iteration computed once (no recomputation); a group reads the complete values of the "
                   "intermediates it reads (partial sums flow only inside a group); every word received is a value or "
                   "a partial sum of one element of an input, an intermediate or the result; one copy of every input "
                   "at the start and of the result at the end, unless the start or end mode replicates them; "
                   "classical arithmetic")
    METRIC = "words received by the busiest rank"
    MEMORY = "memory-independent: they hold for any memory per rank"
    #: Where a plan of several statements moves more than this many times the class bound, the report says that
    #: no tight bound is known for its class (TTMc-like chains: their published bounds cover one statement).
    NOT_TIGHT = 2.0
    MEMORY_DEPENDENT = ("algorithms that run this plan's contraction path fused as any candidate, every rank holding "
                        "at most that memory at any time and running its groups one after another (segments: half "
                        "the words a rank sends and receives, every word sent received once); printed where the plan "
                        "fits the memory; any balance")

    @property
    def assumptions(self) -> str:
        """What the memory-independent bounds assume: the balance (:func:`deinsum.soap.parallel.balance_text`),
        then :attr:`ASSUMPTIONS`."""
        return f"{balance_text(self.rho)}, {self.ASSUMPTIONS}"


@dataclass(frozen=True, eq=False)
class Plan:
    """Everything needed to run (or emit) one einsum on ``nprocs`` ranks."""

    decomposition: Decomposition
    nprocs: int
    dtype: np.dtype
    memory: int                          # bytes per rank
    inputs: str
    result: str
    _ranked: object                      # the planner's SOAP analysis: fusion candidates ranked, no parallel bounds
    groups: tuple[GroupPlan, ...]
    entry: tuple[Layout, ...]
    exit: Layout
    schedule: tuple[Move | Compute, ...]   # in order
    pinned: tuple[str, ...] = ()
    memory_default: str = ""             # where a default memory came from ("": given)
    scores: tuple = ()                   # (partition, (modeled words of the busiest rank, fits)) of each scored
    fusion: tuple = ()                   # candidate, and the plan's partition: what ``bound`` is made from

    @cached_property
    def bound(self) -> PlanBound | None:
        """The per-rank lower bounds this plan is held against (:class:`PlanBound`; made on first use: running a
        plan does not need them), for algorithms within the plan's own :attr:`balance`. None for an einsum without
        binary steps."""
        if self._ranked is None or not self.fusion:
            return None
        return _plan_bound(self, self.bound_analysis, dict(self.scores), self.fusion)

    @cached_property
    def group_bounds(self) -> tuple[int, ...] | None:
        """Words the busiest rank receives at least in each group's moves, in the plan's group order (each group as
        one statement, within the plan's :attr:`balance`; the last at least what the result's copies cost): what
        :attr:`PlanBound.per_group` holds, without the class bound's search over other paths. None as for
        :attr:`bound`."""
        if self._ranked is None or not self.fusion:
            return None
        analysis, last = self.bound_analysis, len(self.decomposition.steps) - 1
        copies = _whole(analysis.result_copies)
        mine = next(c for c in analysis.candidates if c.partition == self.fusion)
        per_group = [max(copies, _whole(g.parallel.Q_indep)) if last in g.steps else _whole(g.parallel.Q_indep)
                     for g in mine.groups]
        in_order = sorted(range(len(self.fusion)), key=lambda k: max(self.fusion[k]))   # the order groups run in
        return tuple(per_group[k] for k in in_order)

    @cached_property
    def balance(self) -> float:
        """``rho``: the most, over the plan's groups, of the busiest rank's iterations over the average ``|V_g|/P``
        (uneven blocks and idle ranks raise it; 1: exactly balanced), rounded up to 6 decimals.

        >>> from deinsum.decompose import decompose
        >>> build_plan(decompose("ij,jk->ik", (5, 5), (5, 5)), nprocs=4).balance    # 3 x 3 x 5 of 125/4
        1.44
        """
        sizes, worst = self.decomposition.sizes, 1.0
        for g in self.groups:
            volume = math.prod(sizes[c] for c in g.indices)
            if volume:
                blocks = (block_range(sizes[c], p, 0) for c, p in zip(g.indices, g.grid.dims))   # the largest
                largest = math.prod(int(stop - start) for start, stop in blocks)
                worst = max(worst, -(-largest * self.nprocs * 10**6 // volume) / 10**6)
        return worst

    @cached_property
    def analysis(self):
        """The SOAP analysis with its parallel bounds at exact balance (made on first use: running a plan does not
        need them); None for an einsum without binary steps."""
        return None if self._ranked is None else self._ranked.balanced(1.0)

    @cached_property
    def bound_analysis(self):
        """The analysis with its parallel bounds at this plan's :attr:`balance` (what :attr:`bound` and the report
        print): :attr:`analysis` where the plan is exactly balanced."""
        if self._ranked is None:
            return None
        return self.analysis if self.balance == 1 else self._ranked.balanced(self.balance)

    @property
    def equation(self) -> str:
        return self.decomposition.equation

    @property
    def moves(self) -> tuple[Move, ...]:
        return tuple(item for item in self.schedule if isinstance(item, Move))

    @property
    def prepasses(self) -> tuple[Prepass, ...]:
        """The unary pre-pass steps, each run on every rank's block of its operand."""
        return tuple(item for item in self.schedule if isinstance(item, Prepass))

    def received_bytes(self) -> np.ndarray:
        """Modeled bytes every rank receives (from the volume model: fast for any number of ranks)."""
        return sum((m.words_received for m in self.moves), np.zeros(self.nprocs, dtype=np.int64)) * self.dtype.itemsize

    @property
    def fixed_layouts(self) -> dict[str, Layout]:
        """The layouts the caller fixed, by tensor name: inputs that start global, on rank 0 or pinned (local); a
        result that ends whole on every rank, on rank 0 or pinned (the planner places the others)."""
        d = self.decomposition
        fixed = {n: s for n, s in zip(d.input_names, self.entry) if self.inputs != "local" or n in self.pinned}
        return {**fixed, "out": self.exit} if self.result != "distributed" or "out" in self.pinned else fixed

    @property
    def data_share(self) -> int:
        """Words of the inputs and result a rank holds at the start or end: the largest block of a fixed
        layout (a global input whole), else an even share: the least memory any plan from this start needs."""
        d, fixed = self.decomposition, self.fixed_layouts
        shapes = {**dict(zip(d.input_names, (lay.shape for lay in self.entry))), "out": self.exit.shape}
        return sum(fixed[n].largest_block() if n in fixed else -(-math.prod(shape) // self.nprocs)
                   for n, shape in shapes.items())

    @property
    def holds_data_share(self) -> bool:
        """Whether a rank's memory holds at least its share of the data (the segment bound needs it)."""
        return self.memory >= self.data_share * self.dtype.itemsize

    @property
    def peak_bytes(self) -> int:
        """The busiest rank's peak memory, in bytes (:func:`deinsum.footprint.footprint`, an upper bound)."""
        return int(footprint(self).max(initial=0))

    @property
    def feasible(self) -> bool:
        """Whether every rank's peak fits the memory; where it does not, no plan the planner found does, and
        :attr:`peak_bytes` is the least memory per rank that would do."""
        return self.peak_bytes <= self.memory

    @property
    def unknown_bound(self) -> str | None:
        """The plain statement that no tight bound is known for this plan's class, where that is so: it runs
        several statements and moves more than :attr:`PlanBound.NOT_TIGHT` times the class bound."""
        if self.bound is None or len(self.groups) < 2:
            return None
        ours = int(self.received_bytes().max(initial=0)) // self.dtype.itemsize
        if ours <= PlanBound.NOT_TIGHT * self.bound.words:
            return None
        return (f"no tight lower bound is known for this plan's class (algorithms that run {len(self.groups)} "
                f"statements): the class bound is the best deinsum proves, {_ratio(ours, self.bound.words)} below the "
                f"plan, and the atomic bound covers one-statement algorithms only")

    def bound_row(self) -> dict:
        """The plan's bounds and busiest rank's words for a per-P table (:func:`deinsum.soap.report.latex`)."""
        b = self.bound
        return {"P": self.nprocs, "class": None if b is None else b.words, "atomic": None if b is None else b.atomic,
                "plan": int(self.received_bytes().max(initial=0)) // self.dtype.itemsize}

    @cached_property
    def memory_bound_words(self) -> int | None:
        """The memory-dependent bound (:attr:`PlanBound.MEMORY_DEPENDENT`) at this plan's memory per rank, in words;
        None where the plan does not fit it (or has no bound)."""
        if self.bound is None or not self.feasible:
            return None
        return _whole(self._ranked.memory_words(self.memory // self.dtype.itemsize))

    @property
    def lower_bound_bytes(self) -> float:
        """The class bound in bytes: what the busiest rank receives at least (:attr:`PlanBound.covers`)."""
        return 0.0 if self.bound is None else self.bound.words * self.dtype.itemsize

    def model_bytes(self) -> list[tuple[int, int]]:
        """Predicted (bytes sent, bytes received) of every rank, from the exchange tables."""
        return self._model_bytes

    @cached_property
    def _model_bytes(self) -> list[tuple[int, int]]:
        size = self.dtype.itemsize
        return [(sum(m.redistribution.bytes_sent(r, size) for m in self.moves),
                 sum(m.redistribution.bytes_received(r, size) for m in self.moves)) for r in range(self.nprocs)]

    def _move_kind(self, m: Move) -> str:
        kind = f"{m.phase} (convert pinned layout)" if m.tensor in self.pinned else m.phase
        return kind + m.manner

    def __str__(self) -> str:
        return self.text()

    def text(self, bounds: bool = True) -> str:
        """The printed plan (``str(plan)``); without ``bounds``, no lower bounds (an emitted script's header:
        ``deinsum plan`` prints them)."""
        d, size = self.decomposition, self.dtype.itemsize
        lines = [f"deinsum plan for {d.equation!r} on {self.nprocs} rank(s), dtype {self.dtype.name}",
                 f"  inputs: {INPUT_MODES[self.inputs]}; result: {RESULT_MODES[self.result]}"
                 + (f"; pinned: {', '.join(self.pinned)}" if self.pinned else ""),
                 f"  memory per rank: {_human(self.memory)} ({self.memory:,} bytes"
                 + (f"; default: {self.memory_default}, pass memory= or --memory for the real figure)"
                    if self.memory_default else ")")
                 + (f"; peak {_human(self.peak_bytes)}" if self.feasible else
                    f"; INFEASIBLE: the least peak per rank of any plan found is {self.peak_bytes:,} bytes"
                    + ("" if self.holds_data_share else f" (the data's share alone is {self.data_share * size:,})")),
                 str(d), ""]
        if self.prepasses:
            lines.append(f"  pre-pass on each rank's block: {d.prepass_reason()}")
            lines += [f"    {p.step.operation}: {p.src} -> {p.dst}" for p in self.prepasses]
        for g in self.groups:
            ops = "; ".join(s.operation for s in g.steps)
            dims = ", ".join(f"{c}={p}" for c, p in zip(g.indices, g.grid.dims))
            lines.append(f"  group {g.index}: {ops}")
            lines.append(f"    grid ({dims}) on {g.grid.used} of {self.nprocs} ranks"
                         + (f"; {g.grid.idle} idle: {g.grid.reason}" if g.grid.idle else ""))
            if g.rounds:
                index, count = g.rounds
                lines.append(f"    in {g.rounds_text}: each moves 1/{count} of the blocks that hold {index} (the same "
                             + ("bytes in all; those without it move once and stay) and makes that slab of the result"
                                if g.free_rounds else "bytes in all) and adds its partial result"))
            if self.group_bounds is not None:
                lines.append(f"    receives {_human(g.grid.volume * size)} per rank (busiest) in its moves; its bound "
                             f"as one statement {_human(self.group_bounds[g.index] * size)} (its data, received "
                             f"in any group's moves)")
        lines.append("")
        lines.append("  data movement (bytes received per rank, max over ranks):")
        for m in self.moves:
            lines.append(f"    {m.tensor + ': ' + self._move_kind(m):<40} {int(m.words_received.max()) * size:>14,}")
        received = self.received_bytes()
        lines.append(f"  total received per rank: max {int(received.max()):,} bytes, "
                     f"mean {float(received.mean()):,.0f}")
        if bounds and self.bound is not None:
            lines += self._bound_lines(int(received.max(initial=0)) // size)
        return "\n".join(lines)

    def _bound_lines(self, ours: int) -> list[str]:
        """The report's lower bounds, each with its class; the assumptions, start, end, metric and memory."""
        b, size = self.bound, self.dtype.itemsize
        outside = (f"; this plan moves less: it runs {len(self.groups)} statements, outside that class"
                   if ours < b.atomic else "")
        rows = [(b.chosen_words, PlanBound.CHOSEN, ""), (b.words, f"class bound: {b.covers} ({b.binding})", ""),
                (b.atomic, PlanBound.ATOMIC, outside)]
        if self.memory_bound_words:                  # printed where the plan fits and the memory binds at all
            rows.append((self.memory_bound_words, f"memory-dependent bound at {self.memory:,} bytes per rank: "
                                                  f"{PlanBound.MEMORY_DEPENDENT}", ""))
        return ([f"  lower bounds per rank, in bytes ({PlanBound.METRIC}; words in brackets), from inputs "
                 f"{self.inputs!r} to result {self.result!r}; the first three {PlanBound.MEMORY}:"]
                + [f"    {w * size:>14,.0f} ({w:,.0f})  {covers}; ours / bound = {_ratio(ours, w)}{extra}"
                   for w, covers, extra in rows]
                + [f"    assuming {b.assumptions}"]
                + ([f"  {self.unknown_bound}"] if self.unknown_bound else []))

    def to_dict(self) -> dict:
        """The whole plan as JSON-ready data (bytes; words where noted)."""
        size = self.dtype.itemsize

        def layout(lay: Layout, names: str) -> dict:
            return {"shape": list(lay.shape), "grid": list(lay.grid),
                    "axes": [list(lay.axis_dims(x)) for x in range(len(lay.shape))],
                    "partial": list(lay.partial), "indices": names, "spec": lay.spec()}

        d = self.decomposition
        subs, moves, prepass = dict(zip(d.input_names, d.raw_subscripts)), [], []
        for item in self.schedule:   # the indices of each tensor as it moves (a pre-pass changes them)
            if isinstance(item, Prepass):
                prepass.append({"tensor": item.step.operands[0], "operation": item.step.operation,
                                "src": layout(item.src, subs[item.step.operands[0]]),
                                "dst": layout(item.dst, item.step.output)})
                subs[item.step.name] = item.step.output
            elif isinstance(item, Compute):
                subs.update({s.name: s.output for s in item.group.steps})
            else:
                name = item.tensor
                moves.append({"tensor": name, "kind": self._move_kind(item), "src": layout(item.src, subs[name]),
                              "dst": layout(item.dst, subs[name]),
                              "bytes_received_per_rank": (item.words_received * size).tolist(),
                              "bytes_sent_per_rank": [item.redistribution.bytes_sent(r, size)
                                                      for r in range(self.nprocs)] if self.nprocs <= 4096 else None})
        received = self.received_bytes()
        groups = []
        for g in self.groups:
            groups.append({"index": g.index, "steps": [s.operation for s in g.steps],
                           "grid": dict(zip(g.indices, g.grid.dims)), "ranks_used": g.grid.used,
                           "ranks_idle": g.grid.idle, "reason": g.grid.reason,
                           "tensors": {name: layout(g.grid.layout(sub, self.decomposition.sizes, partial=False), sub)
                                       for name, sub in g.reads} | {g.output: layout(g.grid.layout(
                                           g.output_subscripts, self.decomposition.sizes), g.output_subscripts)},
                           "rounds": None if g.rounds is None else {"index": g.rounds[0], "count": g.rounds[1],
                                                                    "kind": "free" if g.free_rounds else "summed"},
                           "received_bytes_max": g.grid.volume * size,
                           "lower_bound_bytes": None if self.group_bounds is None else self.group_bounds[g.index] * size})
        return {"equation": self.equation, "nprocs": self.nprocs, "dtype": self.dtype.name,
                "inputs": self.inputs, "result": self.result, "pinned": list(self.pinned),
                "memory_bytes_per_rank": self.memory,
                "memory_default": self.memory_default or None, "feasible": self.feasible,
                "peak_bytes_per_rank_max": self.peak_bytes,
                "memory_needed_bytes_per_rank": None if self.feasible else self.peak_bytes,
                "data_share_bytes_per_rank": self.data_share * size,
                "entry": {n: layout(lay, s) for n, lay, s in zip(d.input_names, self.entry, d.raw_subscripts)},
                "exit": layout(self.exit, d.output),
                "prepass": prepass, "groups": groups, "moves": moves,
                "received_bytes_per_rank": received.tolist(),
                "received_bytes_max": int(received.max(initial=0)),
                "lower_bound_bytes_per_rank": self.lower_bound_bytes,
                "lower_bound_covers": None if self.bound is None else self.bound.covers,
                "chosen_schedule_bound_bytes_per_rank": 0.0 if self.bound is None else self.bound.chosen_words * size,
                "chosen_schedule_bound_covers": PlanBound.CHOSEN,
                "atomic_lower_bound_bytes_per_rank": 0.0 if self.bound is None else self.bound.atomic * size,
                "atomic_lower_bound_covers": PlanBound.ATOMIC,
                "lower_bound_assumptions": None if self.bound is None else self.bound.assumptions,
                "lower_bound_balance": self.balance, "lower_bound_metric": PlanBound.METRIC,
                "lower_bound_memory": PlanBound.MEMORY,
                "memory_dependent_lower_bound_bytes_per_rank": None if self.memory_bound_words is None else
                self.memory_bound_words * size,
                "memory_dependent_lower_bound_covers": PlanBound.MEMORY_DEPENDENT,
                "tight_bound_unknown": self.unknown_bound,
                "fusion_candidates": [] if self.bound is None else [
                    {"partition": [list(g) for g in p], "lower_bound_bytes": b * size,
                     "received_bytes_per_rank": None if v is None else v * size}
                    for p, b, v in self.bound.candidates]}


def bound_notes(plans) -> list[str]:
    """The sentences a paper's per-P table of ``plans`` (one einsum, one start and end) needs: each bound's class,
    the metric, start and end, the assumptions, and where no tight bound is known."""
    first = plans[0]
    notes = [f"Class bound: {first.bound.covers}. Atomic bound: the whole einsum as one statement (the model of the "
             f"published bounds); it covers one-statement algorithms only. Both count {PlanBound.METRIC} (words of "
             f"{first.dtype.itemsize} bytes), from inputs where they start ({INPUT_MODES[first.inputs]}) to a result "
             f"where it ends ({RESULT_MODES[first.result]}), hold for any memory per rank, and assume: "
             f"{balance_text({p.nprocs: p.bound.rho for p in plans})}, {PlanBound.ASSUMPTIONS}."]
    unknown = [p for p in plans if p.unknown_bound]
    if unknown:
        ps = ", ".join(str(p.nprocs) for p in unknown)
        notes.append(f"At P = {ps} the plan runs several statements and moves more than {PlanBound.NOT_TIGHT:g} times "
                     f"the class bound: no tight lower bound is known for its class (the atomic bound does not cover "
                     f"it; the class bound is the best deinsum proves).")
    return notes


def _human(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"


def _ratio(ours: float, bound: float) -> str:
    return f"{ours / bound:.3f}x" if bound > 0 else ("1 (both zero)" if ours == 0 else "inf (bound 0)")


def planning_ranks(nprocs: int) -> int:
    """The ranks a plan made without MPI assumes share this node, for its default memory: ``min(P, cores)``.

    >>> planning_ranks(1)
    1
    """
    return max(1, min(nprocs, os.cpu_count() or 1))


def _holds_blocks(src: Layout, dst: Layout, nprocs: int, ranks: np.ndarray | None = None) -> bool:
    """Whether every rank (of ``ranks``, default all) already holds exactly its ``dst`` block in ``src``
    (complete sums): no move needed.

    >>> _holds_blocks(Layout.on_root((3, 4), 1), even_layout((3, 4), 1), 1)
    True
    """
    if src == dst:
        return True
    if src.partial or min(src.nranks, nprocs) != min(dst.nranks, nprocs):
        return False
    if ranks is None:
        (src_lo, src_hi), (dst_lo, dst_hi) = src.boxes(nprocs), dst.boxes(nprocs)
    else:
        (src_lo, src_hi), (dst_lo, dst_hi) = src.boxes_of(ranks), dst.boxes_of(ranks)
    return bool(np.array_equal(src_lo, dst_lo) and np.array_equal(src_hi, dst_hi))


def _home(layout: Layout) -> Layout:
    """Where a tensor computed or read on a grid lives when nobody needs it replicated: its blocks spread over
    the copies, partial sums summed.

    >>> _home(Layout((8,), grid=(2, 2), axes=(0,), partial=(1,))).axes
    ((0, 1),)
    """
    return spread(Layout(layout.shape, layout.grid, layout.axes))


def _exit_phase(made: Layout, finish: Layout | None, nprocs: int) -> str:
    """The timer of the move that takes the result from where it is made to where it ends: a gather onto fewer
    ranks than all, a reduction of partial sums, else a redistribution.

    >>> _exit_phase(Layout((4,), (2,), (None,), (0,)), None, 2)
    'reduce'
    """
    if finish is not None and finish.nranks < nprocs:
        return "gather"
    return "reduce" if made.partial else "redistribute"


def _even_diagonal(shape: tuple[int, ...], sub: str, nprocs: int) -> Layout:
    """:func:`deinsum.placement.even_layout` for an operand ``sub`` that may repeat an index: the repeated index
    split along its first axis only, so that each rank's block holds the diagonal of its range (no move to align
    it).

    >>> _even_diagonal((6, 6, 2), "iij", 4).axis_parts(1)
    (1,)
    """
    if not shape:
        return even_layout(shape, nprocs)
    whole = tuple(n if sub.index(c) == k else 1 for k, (n, c) in enumerate(zip(shape, sub)))
    return Layout(shape, balanced_split(whole, nprocs), tuple(range(len(shape))))


def _prepass(name: str, steps, layout: Layout, pinned: Layout | None, nprocs: int) -> tuple[list, Layout]:
    """The schedule items of operand ``name``'s pre-pass ``steps`` from ``layout`` (where it starts; into
    ``pinned`` first, if given), and the layout they leave it in: each step on every rank's block, after a move
    that aligns a repeated index where its axes are split apart (:func:`unary_layouts`).

    >>> from deinsum.decompose import decompose
    >>> d = decompose("ii->", (6, 6))
    >>> items, made = _prepass("in0", d.prepass, even_layout((6, 6), 4), None, 4)
    >>> [type(item).__name__ for item in items], made.partial
    (['Move', 'Prepass', 'Prepass'], (0, 1))
    """
    items = []
    if pinned is not None:
        if not _holds_blocks(layout, pinned, nprocs):
            items.append(Move(name, "distribute", layout, pinned, nprocs))
        layout = pinned
    for step in steps:
        src, dst = unary_layouts(layout, step.subscripts[0], step.output)
        if not _holds_blocks(layout, src, nprocs):
            items.append(Move(step.operands[0], "redistribute", layout, src, nprocs))
        items.append(Prepass(step, src, dst))
        layout = dst
    return items, layout


def _group_reads(steps: tuple[Step, ...]) -> tuple[tuple[str, str], ...]:
    produced = {s.name for s in steps}
    reads = []
    for s in steps:
        for name, sub in zip(s.operands, s.subscripts):
            if name not in produced and (name, sub) not in reads:
                reads.append((name, sub))
    return tuple(reads)


def _group_indices(steps: tuple[Step, ...], sizes: Mapping[str, int]) -> str:
    """A group's indices: the largest tensor it reads first, in its axis order, then the rest as they appear.

    The same big tensor (X in every mode of a CP-ALS sweep) then lies on its grids in the same rank order,
    so a layout it holds in one plan can be its start in the next without a move.
    """
    reads = _group_reads(steps)
    largest = max(reads, key=lambda r: (math.prod(sizes[c] for c in r[1]), len(r[1])))[1] if reads else ""
    return "".join(dict.fromkeys(largest + "".join("".join(s.subscripts) + s.output for s in steps)))


def pin_names(layouts: Mapping | None) -> tuple[tuple[str, object], ...]:
    """Pinned layouts keyed by tensor name (operand numbers become ``"in0"``, ...), sorted: hashable.

    >>> pin_names({0: "even", "out": "even"})
    (('in0', 'even'), ('out', 'even'))
    """
    if layouts is not None and not isinstance(layouts, Mapping):
        raise DeinsumError(f"layouts={layouts!r}: expected a dict from tensor (0 or 'in0', ..., 'out') to layout")
    named = {f"in{key}" if isinstance(key, (int, np.integer)) and not isinstance(key, bool) else str(key): spec
             for key, spec in (layouts or {}).items()}
    return tuple(sorted(named.items()))


def check_pins(d: Decomposition, pins: Mapping) -> None:
    """DeinsumError unless every pinned name (see :func:`pin_names`) is a tensor of ``d``.

    >>> from deinsum.decompose import decompose
    >>> check_pins(decompose("ij,jk->ik"), {"in2": "even"})
    Traceback (most recent call last):
    deinsum.errors.DeinsumError: layouts: 'in2' is not a tensor of 'ij,jk->ik' (expected one of in0, in1, out)
    """
    names = [*d.input_names, "out"]
    for key in pins:
        if key not in names:
            raise DeinsumError(f"layouts: {key!r} is not a tensor of {d.equation!r} (expected one of {', '.join(names)})")


# ----------------------------------------------------------------------------- the search

@dataclass(frozen=True)
class _State:
    """A partial plan during the search: the groups placed so far and where every tensor is."""

    received: np.ndarray                 # words per modeled rank so far
    pending: np.ndarray                  # estimated words still owed for partial intermediates
    layouts: tuple[tuple[str, Layout], ...]
    entry: tuple[tuple[str, Layout], ...]
    items: tuple                         # ("move", Move) | ("compute", GroupPlan)
    held: np.ndarray                     # words per modeled rank held from here to the end (footprint.py)
    over: int = 0                        # words the busiest modeled rank's peak so far exceeds the memory by

    def key(self) -> tuple:
        """Within the memory first (else least over it), then least busiest-rank volume, total volume, idle
        ranks, fewer groups (one local kernel, no intermediates), fewer rounds, then the grids (deterministic)."""
        total = self.received + self.pending
        groups = [item for kind, item in self.items if kind == "compute"]
        return (self.over, int(total.max(initial=0)), int(total.sum()), sum(g.grid.idle for g in groups), len(groups),
                sum(g.rounds[1] for g in groups if g.rounds), tuple(g.grid.dims for g in groups))


class _Planner:
    """Builds plans for one decomposition, P and start/end: the beam search over grids, and the
    assembly of the chosen plan with the exact model on every rank."""

    def __init__(self, d: Decomposition, nprocs: int, starts: dict[str, Layout | None], first: dict[str, Layout],
                 finish: Layout | None, budget: int, kept: tuple[Layout, ...] = (), prefetch: bool = False):
        self.d, self.nprocs, self.starts, self.first, self.finish = d, nprocs, starts, first, finish
        self.prefetch = prefetch             # groups in rounds post the next round's moves early where that fits
        self.kept = kept                     # layouts held to the end besides the starts (operands before a pre-pass)
        self.budget = budget                 # words a rank may hold at its peak (footprint.py's count)
        self.sizes = dict(d.sizes)
        self.ranks = sample_ranks(nprocs, SEARCH_RANKS)
        self._words: dict = {}
        self._grids: dict = {}
        self._terms: dict = {}
        self._groups: dict = {}
        self._most: dict = {}
        self._holds: dict = {}
        self._homes: dict = {}
        self._rounds: dict = {}

    def words(self, src: Layout, dst: Layout, ranks: np.ndarray) -> np.ndarray:
        """:func:`received_words` at ``ranks`` (cached; at every rank, the plan's moves share it)."""
        key = (src, dst, ranks.size)
        if key not in self._words:
            every = ranks.size == self.nprocs
            self._words[key] = received_words(src, dst, self.nprocs, None if every else ranks)
        return self._words[key]

    def past_sample(self, ranks: np.ndarray) -> bool:
        """Whether ``ranks`` are every rank where the search samples fewer (the chosen plan's exact model): there
        the sample or a bound decides first, and what is counted is not cached per group (P words each)."""
        return ranks.size == self.nprocs > self.ranks.size

    def holds(self, src: Layout, dst: Layout, ranks: np.ndarray) -> bool:
        """:func:`_holds_blocks` at ``ranks`` (cached; at every rank, only where the sample ranks hold theirs)."""
        key = (src, dst, ranks.size)
        if key not in self._holds:
            self._holds[key] = ((not self.past_sample(ranks) or self.holds(src, dst, self.ranks))
                                and _holds_blocks(src, dst, self.nprocs, ranks))
        return self._holds[key]

    def held_words(self, terms: tuple, ranks: np.ndarray) -> np.ndarray:
        """Words of footprint terms at ``ranks``: the sum of each term's :func:`deinsum.peak.term_words`
        (cached per term)."""
        total = np.zeros(ranks.size, dtype=np.int64)
        for term in terms:
            key = (term, ranks.size)
            if key not in self._terms:
                self._terms[key] = term_words((term,), ranks)
            total += self._terms[key]
        return total

    def group_words(self, group_steps, choice: GridChoice, ranks: np.ndarray) -> dict:
        """Per ``rounds`` (``(index, T)`` or None), the words at ``ranks`` of a group's own footprint terms
        (:func:`deinsum.footprint.group_terms`) on ``choice``: ``(held, largest transient)``, and with the moved
        inputs; filled by :meth:`peaks` at the search's sample ranks (cached: every partial plan, fusion candidate
        and replan that puts this group on this grid asks for the same)."""
        return self._groups.setdefault((group_steps, choice, None if ranks is None else ranks.size), {})

    def home(self, layout: Layout) -> Layout:
        """:func:`_home` (cached)."""
        if layout not in self._homes:
            self._homes[layout] = _home(layout)
        return self._homes[layout]

    def start(self, ranks: np.ndarray) -> _State:
        """The plan before its first group: the inputs where they start, whole ones with a pinned layout
        moved into it (``first``), modeled at ``ranks``."""
        zero = np.zeros(ranks.size, dtype=np.int64)
        layouts = {n: s for n, s in self.starts.items() if s is not None}
        moves = tuple(Move(n, "distribute", layouts[n], pinned, self.nprocs) for n, pinned in self.first.items()
                      if not self.holds(layouts[n], pinned, ranks))
        received = sum((self.words(m.src, m.dst, ranks) for m in moves), zero)
        pending = sum((self.words(x, self.home(x), ranks) for x in layouts.values() if x.partial), zero)
        held = self.held_words(tuple((x, 1, 0, ()) for x in [*layouts.values(), *(m.dst for m in moves), *self.kept]),
                               ranks)
        return _State(received, pending, tuple((layouts | self.first).items()), (), tuple(("move", m) for m in moves),
                      held, max(0, int(held.max(initial=0)) - self.budget))

    def search(self, partition: tuple[tuple[int, ...], ...], beat: tuple[int, int] | None = None) -> _State | None:
        """The best plan of one partition: a beam over each group's most promising grids; None once every partial
        plan in the beam is worse than ``beat`` (``(over, busiest rank's words)`` of a plan found before): over the
        memory by more, or by as much and its busiest rank already receiving more (neither shrinks as groups are
        added, so none of them could end better)."""
        steps = self.d.steps
        groups = sorted(partition, key=max)      # a group runs once its last step can: topological order
        states = [self.start(self.ranks)]
        for number, members in enumerate(groups):
            group_steps = tuple(steps[k] for k in sorted(members))
            last = number == len(groups) - 1
            extended = []
            for state in states:
                best = self.grids(group_steps, state, last)
                grown = [self.extend(state, number, group_steps, choice, self.ranks, last) for choice in best]
                if all(s.over for s in grown):   # over the memory: the leanest grid of every replication too
                    grown += [self.extend(state, number, group_steps, choice, self.ranks, last)
                              for choice in self.grids(group_steps, state, last, lean=True) if choice not in best]
                extended += grown
            states = sorted(extended, key=_State.key)[:BEAM_WIDTH]
            if beat is not None and min((s.over, int(s.received.max(initial=0))) for s in states) > beat:
                return None
        return states[0]

    def grids(self, group_steps, state: _State, last: bool, lean: bool = False) -> list[GridChoice]:
        """The GRIDS_PER_GROUP best grids of a group by :func:`estimate_words`, given where its inputs are; with
        ``lean``, for every number of ranks that split its summed indices (its partial sums' copies: the 2.5D
        family of matrix multiply), the best grid of that number."""
        indices, out = _group_indices(group_steps, self.sizes), group_steps[-1].output
        layouts = dict(state.layouts)
        reads = tuple((sub, layouts.get(name)) for name, sub in _group_reads(group_steps))
        target = self.finish if last else None
        key = (indices, out, reads, target, lean)
        if key not in self._grids:
            if indices not in self._grids:
                dims, note = candidate_grids(self.nprocs, indices, self.sizes)
                fit = np.round(block_imbalance(dims, indices, self.sizes), 9)
                self._grids[indices] = dims, note, fit, self.nprocs - dims.prod(axis=1)
            dims, note, fit, idle = self._grids[indices]
            estimate = estimate_words(indices, self.sizes, dims, self.nprocs, reads, out, target)
            order = np.lexsort(tuple(dims[:, v] for v in reversed(range(len(indices)))) + (fit, idle, estimate))
            if lean:
                summed = [v for v, c in enumerate(indices) if c not in out]
                copies = dims[order][:, summed].prod(axis=1)
                order = order[np.unique(copies, return_index=True)[1]]
            else:
                order = order[:GRIDS_PER_GROUP]
            self._grids[key] = [GridChoice(indices, tuple(int(p) for p in dims[r]), out, self.nprocs,
                                           int(estimate[r]), note) for r in order]
        return self._grids[key]

    def extend(self, state: _State, number: int, group_steps, choice: GridChoice, ranks: np.ndarray,
               last: bool) -> _State:
        """``state`` with one more group on ``choice``: its input moves, its compute (in the fewest rounds that
        keep the peak within the memory), and (last) the exit."""
        layouts, entry = dict(state.layouts), dict(state.entry)
        received, pending, held = state.received.copy(), state.pending.copy(), state.held.copy()
        items = list(state.items)
        made_by = {item.output: item.index for kind, item in items if kind == "compute"}
        moves = []
        for name, sub in _group_reads(group_steps):
            dst = choice.layout(sub, self.sizes, partial=False)
            src = layouts.get(name)
            if src is None:                       # the planner chooses where this input starts: at home here
                src = entry[name] = self.home(dst)
                held += self.held_words(((src, 1, 0, ()),), ranks)
            elif src.partial:                     # the estimate owed for it is now paid for real
                pending -= self.words(src, self.home(src), ranks)
            if not self.holds(src, dst, ranks):
                phase = "distribute" if name in self.d.input_names else "reduce" if src.partial else "redistribute"
                received += self.words(src, dst, ranks)
                moves.append((name, sub, src, dst, phase))
            layouts[name] = dst
        produced = choice.layout(group_steps[-1].output, self.sizes, partial=True)
        final = (self.finish or self.home(produced)) if last else None
        exit_move = last and not self.holds(produced, final, ranks)
        rounds, prefetch, added, peak = self.rounds(group_steps, choice, moves, final if exit_move else None, held,
                                                    ranks)
        parts = (0, ROUND_PIECES) if rounds and exit_move and self.in_parts(produced, final) else None
        for name, sub, src, dst, phase in moves:
            cut = (sub.index(rounds[0]), rounds[1]) if rounds and rounds[0] in sub else None
            items.append(("move", Move(name, phase, src, dst, self.nprocs, made_by.get(name), cut,
                                       prefetch=prefetch and bool(cut))))
            if cut:                               # only one round's part of it is ever made: it stays at its source
                layouts[name] = src
        group = GroupPlan(number, group_steps, choice, _group_reads(group_steps), group_steps[-1].name,
                          group_steps[-1].output, rounds)
        items.append(("compute", group))
        layouts[group.output] = produced
        if last:
            entry["out"] = final
            if exit_move:
                received += self.words(produced, final, ranks)
                items.append(("move", Move("out", _exit_phase(produced, self.finish, self.nprocs), produced, final,
                                           self.nprocs, number, parts=parts)))
        elif produced.partial:
            pending += self.words(produced, self.home(produced), ranks)
        over = max(state.over, int(peak.max(initial=0)) - self.budget)
        return _State(received, pending, tuple(layouts.items()), tuple(entry.items()), tuple(items), held + added,
                      max(0, over))

    def rounds(self, group_steps, choice: GridChoice, moves: list, final: Layout | None, held: np.ndarray,
               ranks: np.ndarray) -> tuple:
        """``(rounds, prefetch, added, peak)`` of a group on ``choice`` after ``held`` words: ``rounds`` ``(index, T)``
        or None, the fewest over one index, summed or free (summed on a tie), that keep the peak within the memory
        (else those of the least peak), prefetching where the planner does and three rounds' moved parts fit
        (two, and MPI's buffers; rounds over a summed index); the words it adds to what ranks hold, and its peak,
        counted with footprint.py's own terms: moved and computed blocks held (one round's part where they hold the
        index), a step's operand copies (and a piece of the round's partial result, or its slab of the result) or a
        reduction's staging on top;
        ``final``: where the result ends, if it moves. Rounds over either kind move the same words. Cached at the
        sample ranks per memory (fusion candidates and partial plans put the same group on the same grid after the
        same words held; a replan has less memory)."""
        if self.past_sample(ranks):
            return self._fewest_rounds(group_steps, choice, moves, final, held, ranks)
        key = (group_steps, choice, tuple(moves), final, held.tobytes(), self.budget)
        if key not in self._rounds:
            self._rounds[key] = self._fewest_rounds(group_steps, choice, moves, final, held, ranks)
        return self._rounds[key]

    def _fewest_rounds(self, group_steps, choice: GridChoice, moves: list, final: Layout | None, held: np.ndarray,
                       ranks: np.ndarray) -> tuple:
        """:meth:`rounds`, uncached."""
        sizes, out = self.sizes, group_steps[-1].output
        zero = np.zeros(ranks.size, dtype=np.int64)
        staging = [self.held_words(reduction_staging(src, dst), ranks) for _, _, src, dst, _ in moves if src.partial]
        produced = choice.layout(out, sizes, partial=True)
        whole = parts = zero   # the exit's staging: in one step, or in parts (after a group in rounds)
        if final is not None and produced.partial:
            whole = self.held_words(reduction_staging(produced, final), ranks)
            parts = (self.held_words(reduction_staging(produced, final, (0, ROUND_PIECES)), ranks)
                     if self.in_parts(produced, final) else whole)
        exit_words = zero if final is None else self.held_words(((final, 1, 0, ()),), ranks)

        peak = self.peaks(group_steps, choice, moves, ranks, held + exit_words, staging, whole, parts)
        added, first = peak("", 1)
        if first.max(initial=0) <= self.budget:
            return None, False, added, first
        every = self.past_sample(ranks)
        if every:
            sample = self.ranks
            on_sample = self.peaks(group_steps, choice, moves, sample, (held + exit_words)[sample],
                                   [words[sample] for words in staging], whole[sample], parts[sample])
            most = self.most_peak(group_steps, choice, moves, int((held + exit_words).max(initial=0)),
                                  [int(words.max(initial=0)) for words in staging], int(whole.max(initial=0)),
                                  int(parts.max(initial=0)))
        partial_sources = "".join(sub for _, sub, src, _, _ in moves if src.partial)
        indices = sorted((c for c in choice.indices if c not in partial_sources), key=lambda c: c in out)

        def fits(index: str, t: int, prefetch: bool) -> bool:
            """Whether every rank's peak in ``t`` rounds over ``index`` is within the memory: where some sampled
            rank's is not, no; where an upper bound of every rank's is, yes; else counted on every rank."""
            if every:
                if most(index, t, prefetch) <= self.budget:
                    return True
                if on_sample(index, t, prefetch)[1].max(initial=0) > self.budget:
                    return False
            return peak(index, t, prefetch)[1].max(initial=0) <= self.budget

        def fewest(prefetch: bool) -> tuple:
            best, missed = (int(first.max(initial=0)), 1, ""), []
            for index in indices:                   # summed first: they win ties; prefetch over summed ones only
                if prefetch and index in out:
                    continue
                low, high = 2, int(max(-(-sizes[index] // choice.dims[choice.indices.index(index)]), 1))
                if best[0] == 0:                                        # only fewer rounds than found can win
                    high = min(high, best[1] - 1)
                if high < low:
                    continue
                if not fits(index, high, prefetch):                     # no number of rounds fits (or none fewer)
                    if best[0] > 0:
                        missed.append((index, high))
                    continue
                while low < high:                                       # the fewest rounds that fit
                    middle = (low + high) // 2
                    if fits(index, middle, prefetch):
                        high = middle
                    else:
                        low = middle + 1
                best = (0, low, index) if best[0] > 0 or low < best[1] else best
            if best[0] > 0:                                             # none fits: the least peak
                for index, high in missed:
                    best = min(best, (int(peak(index, high, prefetch)[1].max(initial=0)), high, index),
                               key=lambda b: b[:2])
            return best

        prefetch = self.prefetch
        best = fewest(True) if prefetch else None
        if best is None or best[0] > 0:                                 # prefetch only where its buffers fit
            prefetch, best = False, fewest(False)
        _, t, index = best
        if not index:
            return None, False, added, first
        return (index, t), prefetch, *peak(index, t, prefetch)

    def peaks(self, group_steps, choice: GridChoice, moves: list, ranks: np.ndarray, before: np.ndarray,
              staging: list, whole: np.ndarray, parts: np.ndarray):
        """The function ``(index, T, prefetch) -> (added, peak)`` of :meth:`rounds` at ``ranks`` (T = 1: no rounds),
        given the words held ``before`` the group (and its result where it ends), the staging of the reductions
        that bring its inputs and of its result's exit, in one step (``whole``) or in parts."""
        sizes, out = self.sizes, group_steps[-1].output
        # kept for the search (sample ranks); on every rank not kept (P words each: their terms are)
        kept = None if self.past_sample(ranks) else self.group_words(group_steps, choice, ranks)
        subs = tuple(sub for _, sub, _, _, _ in moves)   # on this grid, which inputs move says where they go

        def peak(index: str, t: int, prefetch: bool = False) -> tuple[np.ndarray, np.ndarray]:
            rounds, known = ((index, t) if t > 1 else None), {} if kept is None else kept
            if rounds not in known:
                group_held, group_transients = group_terms(choice, group_steps, out, sizes, rounds)
                known[rounds] = (self.held_words(group_held, ranks),
                                 reduce(np.maximum, (self.held_words(group, ranks) for group in group_transients)))
            key = (rounds, prefetch, subs)
            if key not in known:
                known[key] = self.held_words(_moved_terms(moves, rounds, prefetch), ranks) + known[rounds][0]
            added = known[key]
            top = reduce(np.maximum, staging + [parts if rounds else whole], known[rounds][1])
            return added, before + added + top
        return peak

    def most_peak(self, group_steps, choice: GridChoice, moves: list, before: int, staging: list, whole: int,
                  parts: int):
        """The function ``(index, T, prefetch) -> words``: an upper bound of every rank's peak in :meth:`rounds`
        (each term at its largest block), given the most words any rank holds ``before`` the group and the most of
        each staging (of the reductions that bring its inputs; of its result's exit in one step or in parts)."""
        sizes, out = self.sizes, group_steps[-1].output
        known = self.group_words(group_steps, choice, None)

        def most(index: str, t: int, prefetch: bool = False) -> int:
            rounds = (index, t) if t > 1 else None
            if rounds not in known:
                group_held, group_transients = group_terms(choice, group_steps, out, sizes, rounds)
                known[rounds] = (self.most_words(group_held), max(self.most_words(group) for group in group_transients))
            group_held, group_top = known[rounds]
            return (before + self.most_words(_moved_terms(moves, rounds, prefetch)) + group_held
                    + max(group_top, *staging, parts if rounds else whole))
        return most

    def most_words(self, terms: tuple) -> int:
        """An upper bound of every rank's words of footprint terms: each term at its largest block (cached)."""
        total = 0
        for term in terms:
            if term not in self._most:
                layout, per_word, per_holder, cut = term
                extents = [int(np.diff(layout.axis_bounds(x)).max(initial=0)) for x in range(len(layout.shape))]
                for axis, count in zip(cut[::2], cut[1::2]):
                    extents[axis] = -(-extents[axis] // count)
                self._most[term] = per_word * math.prod(extents) + per_holder
            total += self._most[term]
        return total

    def in_parts(self, produced: Layout, final: Layout) -> bool:
        """Whether the reduction of ``produced`` (a group's partial result) into ``final`` can run in parts: it
        sums directly (no reduce-scatter first) and the result has an axis to cut."""
        return bool(produced.partial and produced.shape) and reduce_split(produced, final, self.nprocs) is None

    def assemble(self, state: _State) -> _State:
        """The chosen plan again on every rank (exact model, exact no-move checks)."""
        ranks = np.arange(self.nprocs)
        full = self.start(ranks)
        groups = [item for kind, item in state.items if kind == "compute"]
        for number, group in enumerate(groups):
            full = self.extend(full, number, group.steps, group.grid, ranks, number == len(groups) - 1)
        return full


def _moved_terms(moves: list, rounds: tuple | None, prefetch: bool) -> tuple:
    """The held footprint terms of a group's input ``moves`` ``(name, sub, src, dst, phase)`` in ``rounds``
    ``(index, T)`` or None (:func:`deinsum.footprint.moved_term`)."""
    index, t = rounds or ("", 1)
    return tuple(moved_term(dst, (sub.index(index), t) if rounds and index in sub else None, prefetch)
                 for _, sub, _, dst, _ in moves)


def _group_volume(items, group_index: int) -> int:
    """Words the busiest rank receives in a group's moves: those that bring it an input of the einsum,
    and those that reduce or move the tensor it produced."""
    words, previous, mine = None, -1, []
    for kind, item in items:
        if kind == "compute":
            previous = item.index
        elif item.group == group_index or (item.group is None and previous == group_index - 1):
            mine.append(item)
    for move in mine:
        words = move.words_received if words is None else words + move.words_received
    return 0 if words is None else int(words.max(initial=0))


def build_plan(decomposition: Decomposition, nprocs: int, dtype=np.float64, memory: int | None = None,
               inputs: str = "local", result: str = "distributed",
               layouts: Mapping[str, object] | None = None, prefetch: bool = False,
               memory_default: str = "") -> Plan:
    """Plan ``decomposition`` on ``nprocs`` ranks (pure; no MPI needed) in ``memory`` bytes per rank (default:
    :func:`~deinsum.memory.default_memory` of :func:`planning_ranks`; a caller that chose a default itself
    says where it came from in ``memory_default``, which the plan prints).

    ``inputs``/``result`` say where the operands start and the result ends (see
    INPUT_MODES, RESULT_MODES); under ``"local"``/``"distributed"`` the planner
    chooses each tensor's even, non-replicated layout. ``layouts`` pins the
    layout of any input (``"in0"`` or ``0``, ...) or of a distributed result
    (``"out"``): a :class:`Layout` or ``"even"``/``"replicated"``/``"root"``; a
    local input starts in it, a global or root one is moved into it first. Every fusion
    candidate of the SOAP analysis (up to MAX_PARTITIONS) is planned (or left once it cannot beat a plan found:
    :meth:`_Planner.search`) and the one whose busiest rank receives least wins. With ``prefetch``, a group that
    must run in rounds posts each round's moves before the previous round computes, where two rounds' moved parts
    (and room for a third in MPI's buffers) fit the memory (more rounds if need be; ``scripts/bench_rounds.py``
    measures what it gains). A unary pre-pass (diagonals, sums over an index of one operand, squeezes) runs on every
    rank's block where the operand starts (:func:`_prepass`); its partial sums go into the plan like a group's.
    """
    d = decomposition
    if d.sizes is None:
        raise DeinsumError("a run plan needs concrete sizes: pass operand shapes")
    nprocs = as_ranks(nprocs)
    check_choice("inputs", inputs, INPUT_MODES)
    check_choice("result", result, RESULT_MODES)
    dtype = np.dtype(dtype)
    if memory is None:
        memory = default_memory(planning_ranks(nprocs))
        memory_default = f"this machine's free memory / {planning_ranks(nprocs)} rank(s)"
    memory = as_bytes(memory, error=DeinsumError)
    pins = dict(pin_names(layouts))
    check_pins(d, pins)
    shape_of = lambda sub: tuple(d.sizes[c] for c in sub)  # noqa: E731
    unary = {}   # the pre-pass steps of each operand that has some, in order
    for s in d.prepass:
        unary.setdefault(s.operands[0], []).append(s)
    # where each input starts (local blocks pinned or placed by the planner, else whole arrays; an operand with
    # a pre-pass as it comes, then as its pre-pass leaves it) and the pinned layouts whole arrays go to first
    starts, first, raw, prepass = {}, {}, {}, []
    for name, sub, raw_sub, shape in zip(d.input_names, d.input_subscripts, d.raw_subscripts, d.raw_shapes):
        shape = shape if name in unary else shape_of(sub)
        pinned = pin_layout(pins[name], shape, nprocs, name) if name in pins else None
        if inputs == "local":
            starts[name] = pinned if pinned is not None or name not in unary else _even_diagonal(shape, raw_sub, nprocs)
        else:
            starts[name] = mode_layout(inputs, shape, nprocs)
            if pinned is not None:
                first[name] = pinned
        if name in unary:
            raw[name] = starts[name]
            items, starts[name] = _prepass(name, unary[name], starts[name], first.pop(name, None), nprocs)
            prepass += items
    if result != "distributed" and "out" in pins:   # a pinned result layout is where a distributed result ends
        raise DeinsumError(f"layouts: 'out' pins the layout of a distributed result: pass result='distributed', "
                           f"not {result!r}")
    finish = (pin_layout(pins["out"], shape_of(d.output), nprocs, "out") if "out" in pins
              else None if result == "distributed" else mode_layout(result, shape_of(d.output), nprocs))
    held = {**{n: lay for n, lay in starts.items() if lay is not None}, **({"out": finish} if finish else {})}
    analysis = analyze(d, S=max(1, memory // dtype.itemsize), P=nprocs, owned=_owned_words(d, nprocs, held),
                       result_copies=_result_copies_words(d, nprocs, finish), rho=None) if d.steps else None

    if not d.steps:  # a single operand: its pre-pass makes the result, then it goes where it ends
        made = starts["in0"]
        final = finish or _home(made)
        schedule = () if _holds_blocks(made, final, nprocs) else (
            Move("out", _exit_phase(made, finish, nprocs), made, final, nprocs),)
        return Plan(d, nprocs, dtype, memory, inputs, result, analysis, (), (raw["in0"],), final,
                    tuple(prepass) + schedule, tuple(sorted(pins)), memory_default=memory_default)

    planner = _Planner(d, nprocs, starts, first, finish, memory // dtype.itemsize - SLACK // dtype.itemsize,
                       tuple(raw.values()), prefetch)
    for _ in range(REPLANS + 1):
        scored, beat, searched = [], None, analysis.candidates[:MAX_PARTITIONS]
        for candidate in searched:     # (a candidate that cannot beat the best so far is left unfinished)
            state = planner.search(candidate.partition, beat)
            if state is not None:
                scored.append((state.key(), candidate.partition, state))
                beat = min(beat or state.key()[:2], state.key()[:2])
        scored.sort(key=lambda t: (t[0], t[1]))
        best = planner.assemble(scored[0][2])
        entry = {**{n: s for n, s in starts.items() if s is not None}, **dict(best.entry), **raw}
        groups = tuple(item for kind, item in best.items if kind == "compute")
        groups = tuple(replace(g, grid=replace(g.grid, volume=_group_volume(best.items, g.index),
                                               reason=f"{g.grid.reason}; best of {len(searched)} fusion "
                                                      f"candidate(s) x beam {BEAM_WIDTH}")) for g in groups)
        by_index = {g.index: g for g in groups}
        schedule = tuple(prepass) + tuple(Compute(by_index[item.index]) if kind == "compute" else item
                                          for kind, item in best.items)
        plan = Plan(d, nprocs, dtype, memory, inputs, result, analysis, groups,
                    tuple(entry[n] for n in d.input_names), entry["out"], schedule, tuple(sorted(pins)),
                    memory_default=memory_default)
        excess = plan.peak_bytes - memory
        if excess <= 0 or scored[0][0][0]:   # it fits, or the search knew no plan would
            break
        planner.budget -= -(-excess // dtype.itemsize)   # a rank the search did not sample peaks higher
    scores = {partition: (int(state.received.max(initial=0)), state.over == 0) for _, partition, state in scored}
    scores[scored[0][1]] = (int(best.received.max(initial=0)), best.over == 0)
    return replace(plan, scores=tuple(scores.items()), fusion=scored[0][1])


def _plan_bound(plan: Plan, analysis, scored: dict, chosen) -> PlanBound:
    """The plan's bounds (:class:`PlanBound`) from the analysis' memory-independent group bounds, each at
    least what the result's copies cost (``scored``: ``(modeled words, fits)`` of each candidate partition
    scored; ``chosen``: the plan's partition)."""
    copies = _whole(analysis.result_copies)
    candidates = [(c.partition, max(copies, _whole(c.parallel_Q)),
                   None if c.partition not in scored else scored[c.partition][0]) for c in analysis.raised]
    least, best = analysis.class_bound
    words = _whole(least)
    alone = sum(g.parallel.Q_indep for g in best.groups)
    binding = ("no positive bound" if not words else RESULT_COPIES if words == copies else
               "the groups' footprints less the shares held" + (", some jointly" if best.parallel_Q > alone
                                                                 else "")
               + (f", along the path {'; '.join(s.operation for s in best.path)}" if best.path else ""))
    return PlanBound(words, plan.group_bounds, tuple(candidates), binding,
                     _whole(analysis.atomic_words), _whole(analysis.schedule_bound(chosen)), analysis.covers,
                     tuple(None if p not in scored else scored[p][1] for p, _, _ in candidates), analysis.rho)


def _owned_words(d: Decomposition, nprocs: int, layouts: Mapping[str, Layout]) -> dict[str, float]:
    """Words of each tensor held in a fixed layout over all ranks, divided by P, where that is more than
    one copy (partial sums counted as copies: never less than held).

    >>> from deinsum.decompose import decompose
    >>> d = decompose("ij,jk->ik", (4, 5), (5, 6))
    >>> _owned_words(d, 4, {"in0": Layout.replicated((4, 5), 4), "in1": Layout.on_root((5, 6), 4)})
    {'in0': 20.0}
    """
    owned = {}
    for name, lay in layouts.items():
        copies = Layout(lay.shape, lay.grid, lay.axes).n_replicas
        if copies > 1:
            owned[name] = math.prod(lay.shape) * copies / nprocs
    return owned


#: What binds where the copies of a replicated result give the largest bound (see ``_result_copies_words``).
RESULT_COPIES = "the result's copies (replicated blocks)"


def _result_copies_words(d: Decomposition, nprocs: int, finish: Layout | None) -> int:
    """Words some rank receives when the result ends in a fixed layout that gives every rank a block
    of complete values: the rank computing fewest of the last group's iterations (at most 1/P of them)
    completes at most ``|out| // P`` elements and needs a word from elsewhere for each other element of
    its block (every iteration runs once), so at least the smallest block less ``|out| // P``; 0 where
    that is not positive (no copies) or some rank holds nothing.

    >>> from deinsum.decompose import decompose
    >>> d = decompose("ij,jk->ik", (4, 5), (5, 6))
    >>> _result_copies_words(d, 4, Layout.replicated((4, 6), 4)), _result_copies_words(d, 4, None)
    (18, 0)
    >>> _result_copies_words(d, 4, Layout((4, 6), (2, 2), (0, None)))   # rows split in 2, 2 copies each
    6
    """
    if finish is None or finish.n_summands > 1 or 0 in d.sizes.values():
        return 0
    return max(0, finish.smallest_block(nprocs) - math.prod(finish.shape) // nprocs)


def _whole(words: float) -> int:
    """A bound on a count of words as a whole count: received words are whole, so rounded up (the
    bounds carry no solver noise upward: see ``deinsum.soap.parallel.NOISE``).

    >>> _whole(399.2), _whole(-3.0)
    (400, 0)
    """
    return max(0, math.ceil(words))
