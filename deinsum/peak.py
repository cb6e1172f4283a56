"""Peak bytes per rank from footprint terms, and the sizes the kernels and the footprint share.

The run-time half of :mod:`deinsum.footprint`: an emitted script carries this module (numpy only) and checks
its ``FOOTPRINT`` against ``--memory`` with :func:`peak_bytes` before any work; the planner makes the terms
(:func:`deinsum.footprint.footprint_terms`) and counts them the same way.
"""
from __future__ import annotations

import numpy as np


#: Bytes on top of the arrays: numpy ufunc buffers and the Python objects of one call.
SLACK = 2**20
#: An MTTKRP kernel's temporaries up to this many elements are always allowed (beyond it: half of its inputs
#: and output; ``runtime.mttkrp``).
SMALL_SCRATCH = 1 << 16
#: A group in rounds makes each round's partial result (after the first) in this many pieces along its first axis
#: (``Runtime.contract_round``): one piece is held on top of the group's result, not a second result.
ROUND_PIECES = 8


def mttkrp_form(subs, out: str) -> tuple | None:
    """``(x, r, axes)`` (X's place, the rank index, X's factored axes) where ``subs -> out`` is an MTTKRP that
    ``runtime.mttkrp`` runs, else None.

    >>> mttkrp_form(("ja", "ijk", "ka"), "ia")
    (1, 'a', [1, 2])
    """
    big = [n for n, s in enumerate(subs) if len(s) >= 3]
    if len(subs) < 3 or len(big) != 1 or len(set(subs[big[0]])) != len(subs[big[0]]):
        return None
    x = big[0]
    sx = subs[x]
    pairs = [set(s) for n, s in enumerate(subs) if n != x]
    rank = set.intersection(*pairs)
    if any(len(s) != 2 for s in pairs) or len(rank) != 1:
        return None
    (r,) = rank
    modes = [(set(s) - rank).pop() for s in pairs]
    free = [c for c in sx if c not in modes and c != r]
    if (len(set(modes)) != len(modes) or any(m not in sx for m in modes) or len(set(out)) != len(out)
            or set(out) != {*free, r}):
        return None
    return x, r, [sx.index(m) for m in modes]


def mttkrp_runs(ndim: int, axes, bounds=()) -> list:
    """The runs ``(s, e)`` of factored ``axes`` an MTTKRP may take (X as a x k x b, k its axes s..e-1): where X
    cannot merge axes c - 1 and c for c in ``bounds``, those whose view needs no copy (if any).

    >>> mttkrp_runs(3, [1, 2]), mttkrp_runs(3, [1, 2], bounds=(1,))
    ([(1, 2), (1, 3), (2, 3)], [(1, 2), (1, 3)])
    """
    runs = [(s, e) for s in range(ndim) for e in range(s + 1, ndim + 1) if all(q in axes for q in range(s, e))]
    return [(s, e) for s, e in runs if set(bounds) <= {s, e}] or runs


def scratch_words(terms: tuple, words) -> int:
    """Words of ``(subscripts, words per element)`` terms, ``words`` giving a block's words by subscripts."""
    return sum(n * words(sub) for sub, n in terms)


def mttkrp_scratch(sx: str, r: str, axes, out: str, words, bounds=()) -> tuple:
    """What ``runtime.mttkrp.run`` makes beside its result, ``words`` giving a block's words by subscripts:
    ``made[s, e]``, on each run of :func:`mttkrp_runs`, its words on BLAS and the terms of a fused pass per rank
    column (their words left to the caller: the footprint never fuses);
    ``terms``, ``(subscripts, words per element)`` of the least on BLAS: the footprint counts them, the kernel
    keeps within them. On BLAS: the run's Khatri-Rao product and its partial, T, the other modes' product and
    its copy, the result; or where less, X's size (rank columns in blocks); X's copy where views copy X. In a
    fused pass: both products and their last partials, its result.

    >>> n = dict(i=400, j=400, k=134, a=24)                          # X's block cut over k: T is i x k x a
    >>> mttkrp_scratch("ijk", "a", [1, 2], "ia", lambda sub: int(np.prod([n[c] for c in sub])))[0]
    (('ja', 2), ('ika', 1), ('ka', 2), ('ia', 1))
    """
    if r in sx:   # one Hadamard-sum pass against the Khatri-Rao product of every factored mode
        return (("".join(sx[q] for q in sorted(axes)) + r, 2), (out, 1)), {}
    runs = mttkrp_runs(len(sx), axes, bounds)
    copies = ((sx, 1),) if not set(bounds) <= set(runs[0]) else ()
    total = lambda group: scratch_words(group, words)  # noqa: E731
    on_blas, made = {}, {}
    for s, e in runs:
        rest = ("".join(sx[q] for q in axes if not s <= q < e) + r,) if len(axes) > e - s else ()
        whole = ((sx[s:e] + r, 2), (sx[:s] + sx[e:] + r, 1)) + tuple((sub, 2) for sub in rest) + ((out, 1),)
        blocked = ((sx, 1),) + tuple((sub, 1) for sub in rest) + ((out, 1),)
        on_blas[s, e] = (blocked if words(sx) >= SMALL_SCRATCH and total(blocked) < total(whole) else whole) + copies
        fused = ((sx[s:e], 1), (sx[s:e - 1], 1)) + tuple((sub[:k], 1) for sub in rest for k in (-1, -2)) + (
            (out.replace(r, ""), 1),)
        made[s, e] = total(on_blas[s, e]), fused
    return min(on_blas.values(), key=total), made


def term_words(group: tuple, ranks: np.ndarray) -> np.ndarray:
    """Words of one tuple of :func:`deinsum.footprint.footprint_terms` terms at ``ranks``; vectorised.

    >>> from deinsum.layout import Layout
    >>> even = Layout((10, 8), (2,), (0, None))                # blocks of 5 x 8
    >>> term_words(((even, 1, 0, ()), (even, 1, 0, (0, 2))), np.arange(2)).tolist()   # and 3 x 8 of a round
    [64, 64]
    """
    total = np.zeros(ranks.size, dtype=np.int64)
    for layout, per_word, per_holder, cut in group:   # (in place: a million ranks make large temporaries)
        words = layout.block_sizes(ranks, cut)
        total += words if per_word == 1 else per_word * words
        if per_holder:
            total += per_holder * (ranks < layout.nranks)
    return total


def peak_bytes(phases: tuple, ranks, itemsize: int) -> np.ndarray:
    """Peak bytes of :func:`deinsum.footprint.footprint_terms` ``phases`` at ``ranks`` for elements of ``itemsize``
    bytes: the most over phases of what this phase and those before it hold plus its largest transient,
    ``SLACK`` included; vectorised.

    >>> from deinsum.layout import Layout
    >>> even = Layout((10, 8), (2,), (0, None))                # blocks of 5 x 8 (40 words)
    >>> first = (((even, 1, 0, ()),), (((even, 2, 0, ()),),))  # one block held, two on top while it runs
    >>> second = (((even, 1, 0, ()),), ())                    # then one more held
    >>> ((peak_bytes((first, second), [0], 1) - SLACK) // 40).tolist()   # 1 + 2, then 2 + 0
    [3]
    """
    ranks = np.asarray(ranks, dtype=np.int64)
    held = peak = np.zeros(ranks.size, dtype=np.int64)
    for phase_held, transients in phases:
        held = held + term_words(phase_held, ranks)
        transient = np.zeros(ranks.size, dtype=np.int64)
        for group in transients:
            transient = np.maximum(transient, term_words(group, ranks))
        peak = np.maximum(peak, held + transient)
    return peak * itemsize + SLACK
