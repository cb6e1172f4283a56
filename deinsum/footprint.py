"""Each rank's peak memory footprint of a Plan, and the refusal of plans that do not fit.

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
>>> check_footprint(plan, limit=10**6)
Traceback (most recent call last):
...
deinsum.errors.DeinsumError: the plan of 'i,j->ij' on 2 rank(s) needs 13,080,576 bytes per rank at its peak (rank 0) but 1,000,000 bytes are available per rank; use more ranks, or less replication (inputs/result 'local'/'distributed'), or raise the memory limit
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from .codegen.checks import check_memory
from .errors import DeinsumError


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


def check_footprint(plan, limit: int | None = None) -> None:
    """Raise a one-line DeinsumError if some rank's peak footprint exceeds ``limit`` bytes per rank
    (default: the plan's ``memory`` words, itself by default :func:`deinsum.plan.default_memory`),
    before anything is allocated."""
    limit = plan.memory * plan.dtype.itemsize if limit is None else int(limit)
    need = footprint(plan)
    rank = int(np.argmax(need))
    check_memory(int(need[rank]), limit, f"the plan of {plan.equation!r} on {plan.nprocs} rank(s)", rank,
                 DeinsumError)
