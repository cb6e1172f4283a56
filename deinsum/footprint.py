"""Each rank's peak memory footprint of a Plan (``deinsum.program.check_footprint`` refuses plans that do not fit).

The footprint is an upper bound of what the program (``run_program``, in process
or emitted) holds at once on a rank, in bytes:

* the inputs as the caller holds them (their entry layouts, raw shapes), and the
  result of any unary pre-pass;
* every block the program binds: each move's destination block and each step's
  output block on its group's grid (the program keeps its names to the end);
* the largest transient on top: a step's operand copies (transposes for BLAS),
  or a reduction's staging buffers (partial sums received before they are added)
  and the copy that releases them;
* ``SLACK`` bytes for numpy's iterator buffers (a broadcast multiply buffers 2 x 8192
  elements) and the Python objects of a call.

It reads only the plan's decomposition, dtype, entry layouts, groups and moves.

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


def footprint_terms(plan) -> tuple:
    """The plan's peak as layouts, ``(held, transients)``: the sum of the ``held`` terms plus the largest sum of
    one tuple of ``transients``, each term ``(layout, per_word, per_holder)`` counting ``per_word`` words per
    element of the layout's block and ``per_holder`` words where the rank holds a block (see
    :func:`peak_bytes`). Small (a few terms per move and step), so emitted scripts carry it."""
    d = plan.decomposition
    sizes = d.sizes
    volume = lambda sub: int(np.prod([sizes[c] for c in sub], dtype=np.int64))  # noqa: E731
    held = [(layout, 1, 0) for layout in plan.entry]
    for s in d.prepass:   # the caller keeps its raw operand; the pre-pass result comes on top
        n = 0 if s.name == "out" else d.input_names.index(s.name)
        held.append((plan.entry[n], 0, volume(s.output) if s.name == "out" else volume(d.raw_subscripts[n])))
    transients = []
    for m in plan.moves:
        held.append((m.dst, 1, 0))
        if m.src.partial:   # staged partial sums (<= one dst block per summand) and the copy that frees them
            transients.append(((m.dst, m.src.n_summands, 0), (m.src, 2, 0)))
    for g in plan.groups:
        for s in g.steps:
            held.append((g.grid.layout(s.output, sizes, partial=False), 1, 0))
            transients.append(tuple((g.grid.layout(sub, sizes, partial=False), 1, 0) for sub in s.subscripts))
    return tuple(held), tuple(transients)


def peak_bytes(terms: tuple, ranks, itemsize: int) -> np.ndarray:
    """Peak bytes of :func:`footprint_terms` ``terms`` at ``ranks`` for elements of ``itemsize`` bytes,
    ``SLACK`` included; vectorised."""
    ranks = np.asarray(ranks, dtype=np.int64)

    def words(group):
        total = np.zeros(ranks.size, dtype=np.int64)
        for layout, per_word, per_holder in group:
            lo, hi = layout.boxes_of(ranks)
            total += per_word * np.prod(hi - lo, axis=1, dtype=np.int64) + per_holder * (ranks < layout.nranks)
        return total

    held, transients = terms
    transient = np.zeros(ranks.size, dtype=np.int64)
    for group in transients:
        transient = np.maximum(transient, words(group))
    return (words(held) + transient) * itemsize + SLACK


@lru_cache(maxsize=128)
def footprint(plan) -> np.ndarray:
    """Peak bytes per rank (an upper bound; see the module docstring), as an int64 array (cached: do not
    modify it)."""
    return peak_bytes(footprint_terms(plan), np.arange(plan.nprocs), plan.dtype.itemsize)
