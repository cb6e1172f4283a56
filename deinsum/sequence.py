"""Plans for a repeated sequence of einsums that share tensors (a CP-ALS or HOOI sweep).

Each tensor of the sequence has one *home* layout between steps: a step reads
its inputs from their homes and leaves its result at the home of its output,
so the sequence can be repeated with no conversions. Tensors that no step
produces (the data tensor X) get the home that least traffic needs over the
whole sequence, chosen once among the layouts each step's own plan would give
them; a produced tensor's home is where its producer's plan reduce-scatters it
(where the next readers all-gather it from). Pinned ``layouts`` (e.g. small
factors kept ``"replicated"``) are kept as given.

>>> sweep = plan_sequence([("ijk,ja,ka->ia", ("X", "B", "C"), "A"),
...                        ("ijk,ia,ka->ja", ("X", "A", "C"), "B"),
...                        ("ijk,ia,ja->ka", ("X", "A", "B"), "C")],
...                       {"X": (40, 40, 40), "A": (40, 6), "B": (40, 6), "C": (40, 6)}, nprocs=8)
>>> sweep.moved("X"), sweep.layouts["X"].spec()
(False, '2x2x2x1: 0, 1, 2')
>>> sweep.total_words >= sum(sweep.bound_words)
True
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Mapping, Sequence

import numpy as np

from .decompose import decompose
from .errors import DeinsumError
from .options import as_dtype
from .layout import Layout
from .placement import pin_layout
from .plan import Plan
from .program import Program

__all__ = ["SequencePlan", "SequenceStep", "plan_sequence", "reads_moved"]


@dataclass(frozen=True)
class SequenceStep:
    """One einsum of a sequence: ``output = einsum(equation, *inputs)`` over named tensors."""

    equation: str
    inputs: tuple[str, ...]
    output: str

    def __str__(self) -> str:
        return f"{self.output} = einsum({self.equation!r}, {', '.join(self.inputs)})"


@dataclass(frozen=True)
class SequencePlan:
    """The chosen homes and one :class:`~deinsum.plan.Plan` per step (inputs read from their homes,
    the result left at its home): per-step and total traffic next to the sum of the per-step bounds."""

    steps: tuple[SequenceStep, ...]
    nprocs: int
    homes: tuple[tuple[str, Layout], ...]
    plans: tuple[Plan, ...]
    pins: tuple[tuple[str, object], ...]
    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    memory: int | None = None

    @property
    def layouts(self) -> dict[str, Layout]:
        """Every tensor's home layout by name."""
        return dict(self.homes)

    @property
    def step_words(self) -> tuple[int, ...]:
        """Words the busiest rank receives in each step."""
        return tuple(_busiest_words(p) for p in self.plans)

    @property
    def total_words(self) -> int:
        """The sum of the per-step busiest-rank volumes (what a sweep costs)."""
        return sum(self.step_words)

    @property
    def bound_words(self) -> tuple[int, ...]:
        """Each step's lower bound (words per rank) over any fusion, as its plan prints it."""
        return tuple(p.bound.words for p in self.plans)

    @property
    def chosen_bound_words(self) -> tuple[int, ...]:
        """Each step's lower bound (words per rank) for the fusion its plan chose."""
        return tuple(p.bound.chosen_words for p in self.plans)

    def moved(self, name: str) -> bool:
        """Whether any step moves tensor ``name`` (bytes received for reading it away from its home)."""
        return any(reads_moved(step, plan, name) for step, plan in zip(self.steps, self.plans))

    @cached_property
    def programs(self) -> tuple[Program, ...]:
        """One compiled program per step with its homes pinned: called with DistributedArrays at their
        homes (and plain arrays for tensors pinned ``"replicated"``), each runs exactly its step's plan
        (the one planned here, from the plan cache)."""
        shapes, pins = dict(self.shapes), dict(self.pins)
        return tuple(_step_program(s, shapes, self.nprocs, plan.dtype, self.memory, self.layouts, pins)
                     for s, plan in zip(self.steps, self.plans))

    def to_dict(self) -> dict:
        itemsize = self.plans[0].dtype.itemsize
        return {"nprocs": self.nprocs, "dtype": self.plans[0].dtype.name,
                "homes": {name: layout.spec() for name, layout in self.homes},
                "steps": [{"step": str(s), "received_bytes_max": w * itemsize,
                           "lower_bound_bytes": b * itemsize, "chosen_fusion_bound_bytes": c * itemsize}
                          for s, w, b, c in zip(self.steps, self.step_words, self.bound_words,
                                                self.chosen_bound_words)],
                "total_received_bytes": self.total_words * itemsize,
                "sum_of_lower_bounds_bytes": sum(self.bound_words) * itemsize,
                "sum_of_chosen_fusion_bounds_bytes": sum(self.chosen_bound_words) * itemsize}

    def __str__(self) -> str:
        return self.text()

    def text(self, bounds: bool = True) -> str:
        """The printed sequence (``str(sweep)``); without ``bounds``, each step's traffic but not its lower
        bounds (seconds per order-5 MTTKRP: running a sequence does not need them)."""
        itemsize = self.plans[0].dtype.itemsize

        def row(name, words, bound, chosen):
            cells = (name, f"{words * itemsize:,}")
            return cells + (f"{chosen * itemsize:,}", f"{words / chosen:.2f}" if chosen else "-",
                            f"{bound * itemsize:,}") if bounds else cells

        zeros = (0,) * len(self.steps)
        bound, chosen = (self.bound_words, self.chosen_bound_words) if bounds else (zeros, zeros)
        rows = [row(str(s), w, b, c) for s, w, b, c in zip(self.steps, self.step_words, bound, chosen)]
        rows.append(row("total per sweep", self.total_words, sum(bound), sum(chosen)))
        head = ("step", "received B/rank", "bound (this fusion)", "ratio", "bound (any fusion)")[:len(rows[0])]
        widths = [max(len(r[k]) for r in rows + [head]) for k in range(len(head))]

        def line(cells):
            return "  " + "  ".join(c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in enumerate(zip(cells, widths)))

        lines = [f"sequence of {len(self.steps)} einsums on P = {self.nprocs} ranks, {self.plans[0].dtype.name}: "
                 f"bytes the busiest rank receives per step" + (", next to the step's lower bounds" if bounds else ""),
                 line(head)]
        lines += [line(r) for r in rows]
        lines.append("homes (between steps): " + "; ".join(f"{n} {lay.spec()}" for n, lay in self.homes))
        read = dict.fromkeys(t for s in self.steps for t in s.inputs)
        kept = ", ".join(n for n in read if not self.moved(n)) or "none"
        lines.append("read where they live (never moved): " + kept)
        return "\n".join(lines)


def reads_moved(step: SequenceStep, plan: Plan, name: str) -> bool:
    """Whether ``plan`` (of ``step``) moves input tensor ``name`` before reading it: some rank receives
    bytes for it."""
    return any(m.tensor.startswith("in") and step.inputs[int(m.tensor[2:])] == name and int(m.words_received.sum())
               for m in plan.moves)


def _busiest_words(plan: Plan) -> int:
    """Words the busiest rank receives in ``plan``."""
    return int(plan.received_bytes().max(initial=0)) // plan.dtype.itemsize


def _step_program(step: SequenceStep, shapes: Mapping, nprocs: int, dtype, memory, homes: Mapping,
                  pins: Mapping) -> Program:
    """``step`` compiled with local inputs read from ``homes`` and its result left at its home."""
    return Program(step.equation, tuple(shapes[t] for t in step.inputs), nprocs, dtype, memory, "local",
                   "distributed", layouts=_step_pins(step, homes, pins))


def _step_pins(step: SequenceStep, homes: Mapping[str, object], pins: Mapping[str, object]) -> dict:
    """A step's pinned layouts: its inputs at their homes (a pinned mode name kept as given) and its
    output at its home."""
    where = {**homes, **pins}
    chosen = {f"in{n}": where[t] for n, t in enumerate(step.inputs) if t in where}
    if step.output in where:
        chosen["out"] = where[step.output]
    return chosen


def plan_sequence(steps: Sequence, shapes: Mapping[str, Sequence[int]], nprocs: int, dtype=np.float64,
                  memory: int | None = None, layouts: Mapping[str, object] | None = None) -> SequencePlan:
    """Plan ``steps`` (each ``(equation, input names, output name)``) to be repeated on ``nprocs`` ranks.

    ``shapes`` gives the shape of every tensor a step reads; ``layouts`` pins homes by tensor name
    (a Layout, ``"even"``, ``"replicated"``, ``"root"`` or text like ``"2x2: 0, 1"``).
    """
    seq = tuple(_as_step(s) for s in steps)
    if not seq:
        raise DeinsumError("plan_sequence: no steps")
    dtype = as_dtype(dtype)
    shapes = _derived_shapes(seq, {str(k): tuple(int(n) for n in v) for k, v in shapes.items()})
    pins = {str(k): v for k, v in (layouts or {}).items()}
    for name, spec in pins.items():
        if name not in shapes:
            raise DeinsumError(f"plan_sequence: layout pinned for {name!r}, which no step reads")
        pin_layout(spec, shapes[name], nprocs, name)     # checked now, one line
    produced = {s.output for s in seq}
    free = sorted({t for s in seq for t in s.inputs} - produced - set(pins))

    def program(step, homes):
        return _step_program(step, shapes, nprocs, dtype, memory, homes, pins)

    own = [program(s, {}).plan() for s in seq]     # each step on its own: inputs where it likes

    def busiest(plans):
        return sum(_busiest_words(p) for p in plans)

    def placed(free_homes):
        """Every step with the free tensors at ``free_homes`` and the produced ones where the step likes
        (its own plan where that already reads them there)."""
        return [p if all(layout == free_homes[t] for t, layout in zip(s.inputs, p.entry) if t in free_homes)
                else program(s, free_homes).plan() for s, p in zip(seq, own)]

    # candidates for each free tensor: the entry layout each reading step's own plan would give it
    candidates = {t: [] for t in free}
    for s, p in zip(seq, own):
        for t, layout in zip(s.inputs, p.entry):
            if t in candidates and layout not in candidates[t]:
                candidates[t].append(layout)
    # one pass of coordinate descent over the free tensors, scored with the produced tensors unpinned
    choice = {t: candidates[t][0] for t in free}
    first = placed(choice)
    score = busiest(first)
    for t in free:
        for layout in candidates[t][1:]:
            trial = placed(choice | {t: layout})
            words = busiest(trial)
            if words < score:
                score, choice, first = words, choice | {t: layout}, trial
    # a produced tensor's home is where its producer leaves it; the sweep reads it from there
    homes = dict(choice) | {s.output: p.exit for s, p in zip(seq, first)}
    plans = tuple(program(s, homes).plan() for s in seq)
    resolved = {**homes, **{n: pin_layout(spec, shapes[n], nprocs, n) for n, spec in pins.items()}}
    order = list(dict.fromkeys([t for s in seq for t in s.inputs] + [s.output for s in seq]))
    return SequencePlan(seq, nprocs, tuple((n, resolved[n]) for n in order), plans,
                        tuple(sorted(pins.items())), tuple(sorted(shapes.items())), memory)


def _derived_shapes(seq: tuple[SequenceStep, ...], shapes: dict) -> dict:
    """``shapes`` with every step's output shape added (from its inputs' shapes), checked where given."""
    shapes, derived = dict(shapes), set()
    for _ in seq:                      # a step's inputs may be outputs of steps after it
        for s in seq:
            if s not in derived and all(t in shapes for t in s.inputs):
                derived.add(s)
                d = decompose(s.equation, *(shapes[t] for t in s.inputs))
                out = tuple(d.sizes[c] for c in d.output)
                if shapes.setdefault(s.output, out) != out:
                    raise DeinsumError(f"plan_sequence: {s} makes {s.output!r} of shape {out}, "
                                       f"given as {shapes[s.output]}")
    for s in seq:
        missing = [t for t in s.inputs if t not in shapes]
        if missing:
            raise DeinsumError(f"plan_sequence: the shape of {missing[0]!r} (read by {s}) is not given")
    return shapes


def _as_step(item) -> SequenceStep:
    if isinstance(item, SequenceStep):
        return item
    try:
        equation, inputs, output = item
    except (TypeError, ValueError):
        raise DeinsumError(f"plan_sequence: step {item!r} is not (equation, input names, output name)") from None
    if isinstance(inputs, str):
        inputs = tuple(x.strip() for x in inputs.split(","))
    return SequenceStep(str(equation), tuple(str(t) for t in inputs), str(output))
