"""Each rank's peak memory footprint of a Plan (``deinsum.program.check_footprint`` refuses plans that do not fit).

The footprint is an upper bound of what the program (``run_program``, in process
or emitted) holds at once on a rank, in bytes:

* the inputs as the caller holds them (their entry layouts, raw shapes), and the
  blocks their unary pre-pass steps make;
* every block the program binds: each move's destination block and each group's
  result block on its grid (the program keeps its names to the end); in a group
  that runs in rounds, one round's part of the moved blocks that hold the rounds'
  index (a summed index, or a free one: then the result is made slab by slab);
* the largest transient on top: while a group's kernel runs, its intermediate steps'
  outputs and a step's operand copies (transposes for BLAS), in rounds of one
  round's part and of the piece the kernel is called on (``Runtime.contract_round``
  cuts what holds the result's first index into ROUND_PIECES pieces), and a piece of
  the round's partial result (over a free index: the round's slab of the result);
  or a reduction's staging buffers (partial sums received before they are added)
  and the copy that releases them (a reduction in parts: one part's);
* ``SLACK`` bytes for numpy's iterator buffers (a broadcast multiply buffers 2 x 8192
  elements) and the Python objects of a call.

It reads only the plan's decomposition, dtype, entry layouts, pre-passes, groups and moves.

>>> import deinsum
>>> plan = deinsum.compile("i,j->ij", (1000,), (1000,)).plan(nprocs=2, inputs="global", result="all")
>>> int(footprint(plan).max()) >= 1000 * 1000 * 8      # the whole result on every rank
True
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np


#: Bytes on top of the arrays: numpy ufunc buffers and the Python objects of one call.
SLACK = 2**20
#: A group in rounds makes each round's partial result (after the first) in this many pieces along its first axis
#: (``Runtime.contract_round``): one piece is held on top of the group's result, not a second result.
ROUND_PIECES = 8


def footprint_terms(plan) -> tuple:
    """The plan's peak as layouts, ``(held, transients)``: the sum of the ``held`` terms plus the largest sum of
    one tuple of ``transients``, each term ``(layout, per_word, per_holder, cut)`` counting ``per_word`` words
    per element of the layout's block (of one round's part of it where ``cut`` is ``(axis, rounds)``; of one
    piece of that where it goes on ``axis, pieces``: :meth:`deinsum.layout.Layout.block_sizes`) and
    ``per_holder`` words where the rank holds a block (see :func:`peak_bytes`). Small (a few terms per move
    and step), so emitted scripts carry it."""
    sizes = plan.decomposition.sizes
    # the caller keeps its operands; each pre-pass step's blocks come on top
    held = [(layout, 1, 0, ()) for layout in plan.entry] + [(p.dst, 1, 0, ()) for p in plan.prepasses]
    transients = []
    for m in plan.moves:
        held.append((m.dst, 1, 0, m.rounds or ()))
        if m.src.partial:
            transients.append(reduction_staging(m.src, m.dst, m.parts))
    for g in plan.groups:
        group_held, group_transients = group_terms(g.grid, g.steps, g.output_subscripts, sizes, g.rounds)
        held += group_held
        transients += group_transients
    return tuple(held), tuple(transients)


def group_terms(grid, steps, output_subscripts: str, sizes, rounds: tuple | None) -> tuple:
    """``(held, transients)`` of one fused group on ``grid`` (a :class:`deinsum.grids.GridChoice`), in
    ``rounds`` ``(index, T)`` or None: its result block held whole (the program keeps it to the end); while its
    kernel runs (``contract_group``: one call computes every step), its intermediate steps' outputs and each
    step's operand copies on top, one round's part of those that hold the index, and in rounds the round's
    result: over a summed index a piece of its partial result (see ``Runtime.contract_round``: each round runs
    the group on ROUND_PIECES pieces along the result's first index, so what holds that index is made or copied
    a piece at a time), over a free index its slab of the result (``Runtime.contract_slab``). The planner counts
    a candidate group with the same terms."""
    index, count = rounds or ("", 1)
    first = output_subscripts[:1] if rounds and index not in output_subscripts else ""
    cut = lambda sub: (sub.index(index), count) if index and index in sub else ()  # noqa: E731
    piece = lambda sub: cut(sub) + ((sub.index(first), ROUND_PIECES) if first and first in sub else ())  # noqa: E731
    block = lambda sub: grid.layout(sub, sizes, partial=False)  # noqa: E731
    result = ((block(output_subscripts), 1, 0, piece(output_subscripts)),) if rounds else ()
    inner = tuple((block(s.output), 1, 0, piece(s.output)) for s in steps[:-1])
    held = ((block(output_subscripts), 1, 0, ()),)
    return held, tuple(inner + tuple((block(sub), 1, 0, piece(sub)) for sub in s.subscripts) + result for s in steps)


def reduction_staging(src, dst, parts: tuple | None = None) -> tuple:
    """The transient terms of moving partial sums ``src`` into ``dst``: in one step, the staged summands
    (at most one destination block each) and the copy that frees them; in ``parts`` ``(axis, T)``, one
    part's summands, the part and its copy (its source is C-ordered: ``Runtime.in_parts``)."""
    if parts:
        return ((dst, src.n_summands + 1, 0, parts),)
    return ((dst, src.n_summands, 0, ()), (src, 2, 0, ()))


def term_words(group: tuple, ranks: np.ndarray) -> np.ndarray:
    """Words of one tuple of :func:`footprint_terms` terms at ``ranks``; vectorised.

    >>> from deinsum.layout import Layout
    >>> even = Layout.even((10, 8), 2)                        # blocks of 5 x 8
    >>> term_words(((even, 1, 0, ()), (even, 1, 0, (0, 2))), np.arange(2)).tolist()   # and 3 x 8 of a round
    [64, 64]
    """
    total = np.zeros(ranks.size, dtype=np.int64)
    for layout, per_word, per_holder, cut in group:
        total += per_word * layout.block_sizes(ranks, cut) + per_holder * (ranks < layout.nranks)
    return total


def peak_bytes(terms: tuple, ranks, itemsize: int) -> np.ndarray:
    """Peak bytes of :func:`footprint_terms` ``terms`` at ``ranks`` for elements of ``itemsize`` bytes,
    ``SLACK`` included; vectorised."""
    ranks = np.asarray(ranks, dtype=np.int64)
    held, transients = terms
    transient = np.zeros(ranks.size, dtype=np.int64)
    for group in transients:
        transient = np.maximum(transient, term_words(group, ranks))
    return (term_words(held, ranks) + transient) * itemsize + SLACK


@lru_cache(maxsize=128)
def footprint(plan) -> np.ndarray:
    """Peak bytes per rank (an upper bound; see the module docstring), as an int64 array (cached: do not
    modify it)."""
    return peak_bytes(footprint_terms(plan), np.arange(plan.nprocs), plan.dtype.itemsize)
