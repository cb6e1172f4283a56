"""Each rank's peak memory footprint of a Plan (``deinsum.program.check_footprint`` refuses plans that do not fit).

The footprint is an upper bound of what the program (``run_program``, in process
or emitted) holds at once on a rank, in bytes:

* the inputs as the caller holds them (their entry layouts, raw shapes), and the
  blocks their unary pre-pass steps make;
* every block the program has bound so far: each move's destination block and each group's
  result block on its grid (the program keeps its names to the end, so the blocks of the
  groups that come later are not there yet when a group runs); in a group
  that runs in rounds, one round's part of the moved blocks that hold the rounds'
  index (a summed index, or a free one: then the result is made slab by slab; two rounds'
  parts of a move that prefetches: round t + 1's arrives while round t computes, and room for one more that
  MPI buffers of the exchange in flight: three in all);
* the largest transient on top: while a group's kernel runs, what it makes (an MTTKRP:
  :func:`deinsum.peak.mttkrp_scratch`; else its intermediate steps' outputs and a step's operand
  copies, transposes for BLAS), in rounds of one
  round's part and of the piece the kernel is called on (``Runtime.contract_round``
  cuts what holds the result's first index into ROUND_PIECES pieces), and a piece of
  the round's partial result (over a free index: the round's slab of the result);
  or a reduction's staging buffers (partial sums received before they are added)
  and the copy that releases them (a reduction in parts: one part's);
* ``SLACK`` bytes for numpy's iterator buffers (a broadcast multiply buffers 2 x 8192
  elements) and the Python objects of a call.

It reads only the plan's decomposition, dtype, entry layouts, pre-passes, groups and moves. The terms'
bytes at a rank are :func:`deinsum.peak.peak_bytes` (emitted scripts carry that module, not this one).

>>> import deinsum
>>> plan = deinsum.compile("i,j->ij", (1000,), (1000,)).plan(nprocs=2, inputs="global", result="all")
>>> int(footprint(plan).max()) >= 1000 * 1000 * 8      # the whole result on every rank
True
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from .peak import ROUND_PIECES, mttkrp_form, mttkrp_scratch, peak_bytes
from .schedule import Move, Prepass


def footprint_terms(plan) -> tuple:
    """The plan's peak as layouts, one ``(held, transients)`` per phase: a group with the moves that bring its
    inputs (the last also with its result's exit). A phase's peak is the sum of the ``held`` terms of that phase
    and every phase before it (the program keeps what it binds to the end) plus the largest sum of one tuple of
    its ``transients``; the plan's is the most over its phases. Each term ``(layout, per_word, per_holder, cut)``
    counts ``per_word`` words per element of the layout's block (of one round's part of it where ``cut`` is
    ``(axis, rounds)``; of one piece of that where it goes on ``axis, pieces``:
    :meth:`deinsum.layout.Layout.block_sizes`) and ``per_holder`` words where the rank holds a block (see
    :func:`peak_bytes`). Small (a few terms per move and step), so emitted scripts carry it."""
    sizes = plan.decomposition.sizes
    # the caller keeps its operands; each pre-pass step's blocks come on top
    held, transients, phases = [(layout, 1, 0, ()) for layout in plan.entry], [], []
    for item in plan.schedule:
        if isinstance(item, Prepass):
            held.append((item.dst, 1, 0, ()))
        elif isinstance(item, Move):
            held.append(moved_term(item.dst, item.rounds, item.prefetch))
            if item.src.partial:
                transients.append(reduction_staging(item.src, item.dst, item.parts))
        else:
            group = item.group
            group_held, group_transients = group_terms(group.grid, group.steps, group.output_subscripts, sizes,
                                                       group.rounds)
            phases.append([held + list(group_held), transients + list(group_transients)])
            held, transients = [], []
    if phases:                 # the exit, in the last group's phase (as the planner counts it)
        phases[-1][0] += held
        phases[-1][1] += transients
    else:
        phases.append([held, transients])
    return tuple((tuple(h), tuple(t)) for h, t in phases)


def group_terms(grid, steps, output_subscripts: str, sizes, rounds: tuple | None) -> tuple:
    """``(held, transients)`` of one fused group on ``grid`` (a :class:`deinsum.grids.GridChoice`), in
    ``rounds`` ``(index, T)`` or None: its result block held whole (the program keeps it to the end); while its
    kernel runs (``contract_group``: one call computes every step), what it makes (:func:`mttkrp_scratch`, else
    its intermediate steps' outputs and each step's operand copies), one round's part of those that hold the
    index, and in rounds the round's result: over a summed index a piece of its partial result
    (``Runtime.contract_round`` runs the group on ROUND_PIECES pieces along the result's first index), over a
    free index its slab of the result (``Runtime.contract_slab``). The planner counts a candidate group
    likewise."""
    index, count = rounds or ("", 1)
    first = output_subscripts[:1] if rounds and index not in output_subscripts else ""
    cut = lambda sub: (sub.index(index), count) if index and index in sub else ()  # noqa: E731
    piece = lambda sub: cut(sub) + ((sub.index(first), ROUND_PIECES) if first and first in sub else ())  # noqa: E731
    block = lru_cache(maxsize=None)(lambda sub: grid.layout(sub, sizes, partial=False))   # each asked for often
    result = ((block(output_subscripts), 1, 0, piece(output_subscripts)),) if rounds else ()
    held = ((block(output_subscripts), 1, 0, ()),)
    made = {s.name for s in steps}
    reads = tuple(sub for s in steps for name, sub in zip(s.operands, s.subscripts) if name not in made)
    form = mttkrp_form(reads, output_subscripts)
    if form is not None:
        x, r, axes = form
        sx = reads[x]
        bounds = tuple(sx.index(c) for c in (index, first) if c and c in sx[1:])
        first_block = lru_cache(maxsize=None)(lambda sub: int(block(sub).block_sizes(np.zeros(1, dtype=np.int64),
                                                                                     piece(sub))[0]))
        terms, _ = mttkrp_scratch(sx, r, axes, output_subscripts, first_block, bounds)
        return held, (tuple((block(sub), per_word, 0, piece(sub)) for sub, per_word in terms) + result,)
    inner = tuple((block(s.output), 1, 0, piece(s.output)) for s in steps[:-1])
    return held, tuple(inner + tuple((block(sub), 1, 0, piece(sub)) for sub in s.subscripts) + result for s in steps)


def moved_term(dst, cut: tuple | None, prefetch: bool = False) -> tuple:
    """The held term of a move's destination block ``dst``: one round's part of it where it runs in rounds
    ``cut`` ``(axis, T)``; with ``prefetch`` three: the next round's part is posted before this one is used, and
    MPI buffers up to one more of a nonblocking exchange in flight (measured on MM 1536^3 at P = 4 with 9 rounds:
    0.9 MB above two parts, 1.0 MiB each)."""
    return dst, 3 if prefetch and cut else 1, 0, cut or ()


def reduction_staging(src, dst, parts: tuple | None = None) -> tuple:
    """The transient terms of moving partial sums ``src`` into ``dst``: in one step, the staged summands
    (at most one destination block each) and the copy that frees them; in ``parts`` ``(axis, T)``, one
    part's summands, the part and its copy (its source is C-ordered: ``Runtime.in_parts``)."""
    if parts:
        return ((dst, src.n_summands + 1, 0, parts),)
    return ((dst, src.n_summands, 0, ()), (src, 2, 0, ()))


@lru_cache(maxsize=128)
def footprint(plan) -> np.ndarray:
    """Peak bytes per rank (an upper bound; see the module docstring), as an int64 array (cached: do not
    modify it)."""
    return peak_bytes(footprint_terms(plan), np.arange(plan.nprocs), plan.dtype.itemsize)
