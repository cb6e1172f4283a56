"""MTTKRP on one rank's blocks: out[free..., r] = sum over the factored modes of X[...] * prod_q F_q[n_q, r].

STANDALONE: numpy, the standard library and the sibling runtime modules. Full or partial MTTKRP (any
modes, factors in either orientation): GEMMs on views of X (no copy of X) against the Khatri-Rao product
of one contiguous run of modes, then a Hadamard-sum over the other factored modes (both in one pass of the
streaming kernels where those modes lead X or follow the free ones); rank columns in blocks where the
temporaries would exceed half of the inputs plus output (and 2**16 elements); where X already holds the
rank index, one Hadamard-sum pass. Of the variants (run of modes, orientation, library) that make at most
the least scratch on BLAS (``peak.mttkrp_scratch``, as the footprint counts), the one of lowest modeled cost
(``cost.py``: the MTTKRP GEMMs' fit of the library each runs on).

>>> x, f = np.ones((4, 5, 6)), np.ones((5, 3))
>>> kind, name, params = strategy(("ijk", "ja", "ka"), "ia", {"i": 4, "j": 5, "k": 6, "a": 3}, False, 8, False)
>>> run(("ijk", "ja", "ka"), "ia", [x, f, np.ones((6, 3))], x.dtype, params).tolist()[0]
[30.0, 30.0, 30.0]
"""
import itertools
import math

import numpy as np

from ..peak import SMALL_SCRATCH, mttkrp_form, mttkrp_scratch, scratch_words
from . import blas
from .cost import ELEM, FUSED_RATE, L2_BYTES, MTTKRP_FIT, gemm_seconds
from .libraries import array_module



def strategy(subs, out, sizes, mkl, itemsize, stream, bounds=None):
    """Full or partial MTTKRP (several free modes; X may already hold r: then a Hadamard-sum), on a run of modes
    ``mttkrp_runs`` allows for X's ``bounds`` (``kernels._bounds`` per operand)."""
    form = mttkrp_form(subs, out)
    if form is None:
        return None
    x, r, axes = form
    sx = subs[x]
    modes = [sx[q] for q in axes]
    free = [c for c in sx if c not in modes and c != r]
    if r in sx:  # X already holds r: one elementwise pass, no GEMM
        return "mttkrp", f"MTTKRP to ({','.join(free)}): Hadamard-sum over ({','.join(c for c in sx if c in modes)})", \
            (x, r, None)
    dims, nr = [sizes[c] for c in sx], sizes[r]
    words = lambda sub: math.prod(sizes[c] for c in sub)  # noqa: E731
    budget = max(SMALL_SCRATCH, 0.5 * (sum(map(words, subs)) + words(out)))
    _, made = mttkrp_scratch(sx, r, axes, out, words, bounds[x] if bounds else ())
    least = min(on_blas for on_blas, _ in made.values())        # what the footprint counts
    narrow = -(-nr // -(-nr // blas._STREAM_NARROW))           # even blocks of rank columns a fused pass takes
    best = None
    for (s, e, orient), on_mkl in itertools.product(_variants(made), (False, True)[:1 + mkl]):
        a, k, b = math.prod(dims[:s]), math.prod(dims[s:e]), math.prod(dims[e:])
        rest = math.prod(dims[q] for q in axes if not s <= q < e)
        extra, width = (2 * k + a * b + rest) * nr, nr      # Khatri-Rao (and its last partial), T, rest's KRP
        summed = [q for q in axes if not s <= q < e]
        fused = stream and _fusion(dims, s, e, orient, summed, narrow)
        on_blas, per_column = made[s, e][0], scratch_words(made[s, e][1], words)
        if (narrow * per_column + words(out) if fused else on_blas) > least:
            continue
        if fused:
            extra, width = (2 * k + rest + a * b // rest) * nr, narrow   # no T: the scratch is one result
        block = width if extra <= budget else max(1, int(width * budget // extra))
        if fused and on_blas > least and not _fusion(dims, s, e, orient, summed, block):
            continue    # narrower, it runs on BLAS
        seconds = _seconds(dims, axes, nr, (s, e, orient, block, on_mkl), itemsize, stream)
        if best is None or seconds < best[0]:
            best = (seconds, s, e, orient, block, on_mkl)
    _, s, e, orient, block, on_mkl = best
    streamed = _variant_streams(dims, s, e, orient, block)
    hadamard = [c for c in sx if c in modes and c not in sx[s:e]]
    name = (f"MTTKRP to ({','.join(free)}): GEMM over ({','.join(sx[s:e])}) "
            f"{'X^T KR' if orient == 'rows' else 'KR^T X'}")
    if stream and _fusion(dims, s, e, orient, [sx.index(c) for c in hadamard], block):
        name += f" and Hadamard-sum over ({','.join(hadamard)}) in one streamed pass"
    else:
        name += " (streamed)" if stream and streamed else " (MKL)" if on_mkl else ""
        if hadamard:
            name += f", Hadamard-sum over ({','.join(hadamard)})"
    if block < nr:
        name += f", rank columns in blocks of {block}"
    return "mttkrp", name, (x, r, (s, e, orient, block, on_mkl))


def _seconds(dims, axes, nr, variant, itemsize, stream):
    """Modeled seconds of an MTTKRP variant (s, e, orient, block, on_mkl) on X of ``dims`` summed over
    ``axes``: the GEMM and Hadamard-sum in one pass of the streaming kernels where ``_fusion`` runs it
    (with ``stream``: float64 on the CPU), else the GEMM (on the streaming kernels where they take it, else
    ``MTTKRP_FIT`` of its library) and the elementwise passes.

    >>> round(1e3 * _seconds((256,) * 3, [0, 1], 24, (1, 2, "cols", 24, True), 8, False), 1)   # MKL
    12.9
    """
    s, e, orient, block, on_mkl = variant
    a, k, b = math.prod(dims[:s]), math.prod(dims[s:e]), math.prod(dims[e:])
    rest = math.prod(dims[q] for q in axes if not s <= q < e)
    fused = stream and _fusion(dims, s, e, orient, [q for q in axes if not s <= q < e], block)
    if fused:   # X read once per block of rank columns, each in whole vectors of 8
        return 2.0 * a * k * b * -(-nr // block) * -(-block // 8) * 8 / FUSED_RATE[fused] + ELEM * (k + rest) * nr
    chunks = -(-nr // block)
    if e == len(dims) and orient == "rows":
        shape = (a, k, block, chunks)
    elif e == len(dims) or s == 0:
        shape = (block, k, a * b, chunks) if orient == "cols" else (b, k, block, chunks)
    else:
        shape = (block, k, b, a * chunks) if orient == "cols" else (b, k, block, a * chunks)
    where = 0 if e == len(dims) else 1 if s > 0 else 2     # the run of modes: trailing, middle, leading
    if on_mkl and orient == "cols" and where == 1 and k * b * itemsize > L2_BYTES:
        where = 2   # MKL's batched KR^T X runs as fast as over middle modes only while a slab of X fits in L2
    fit = MTTKRP_FIT[on_mkl]
    gemm = gemm_seconds(*shape, short=fit[:3]) / fit[3 + 3 * (orient == "cols") + where]
    if stream and not on_mkl and _variant_streams(dims, s, e, orient, block):   # the GEMM on the streaming kernels
        gemm = 2.0 * a * k * b * chunks * -(-block // 8) * 8 / FUSED_RATE[orient]
    return gemm + ELEM * ((k + a * b + rest) * nr + (a * b * nr / 4 if rest > 1 else 0))


def _variant_streams(dims, s, e, orient, block):
    """Whether the GEMM ``run`` makes for this variant (X C-ordered) runs on the streaming kernels:
    ``_streamed`` takes it where ``_stream_kind`` names the kernel whose wide operand has unit-stride rows.

    >>> _variant_streams((256, 256, 256), 2, 3, "rows", 24) == bool(blas._STREAM)
    True
    """
    n = len(dims)
    a, k, b = math.prod(dims[:s]), math.prod(dims[s:e]), math.prod(dims[e:])
    if orient == "rows" and e == n:     # X (a x k) @ KR: both operands' rows in place
        return blas.stream_kind(1, a, k, block, False, False) is not None
    if orient == "cols" and s == 0:     # KR^T (its rows strided) @ X (k x b)
        return blas.stream_kind(1, block, k, b, False, False) == "cols"
    if orient == "cols" and e < n:      # KR^T @ X (a batches of k x b)
        return blas.stream_kind(a, block, k, b, False, True) == "cols"
    return False                        # X's rows strided: X^T KR over leading or middle modes, KR^T X over trailing


def _variants(runs):
    """(s, e, orient): GEMM over the factored axes s..e-1 (one of ``runs``, e.g. ``mttkrp_runs``), T as (..., R)
    or (R, ...)."""
    return [(s, e, o) for s, e in runs for o in ("rows", "cols")]


def _khatri_rao(mats):
    """Row-wise Khatri-Rao product of (n_q, R) matrices: ((prod n_q), R), last factor fastest."""
    res = mats[0]
    for m in mats[1:]:
        res = (res[:, None, :] * m[None, :, :]).reshape(-1, res.shape[1])
    return res


def run(subs, out, blocks, dtype, params):
    """T = X times the Khatri-Rao product of modes s..e-1 (GEMMs on views of X), then a Hadamard-sum."""
    x, r, gemm = params
    sx, xb = subs[x], blocks[x]
    n = xb.ndim
    factors = {sx.index(sub.replace(r, "")): blocks[k] if sub[1] == r else blocks[k].T
               for k, sub in enumerate(subs) if k != x}           # axis of X -> (n_axis, R)
    label = {c: q for q, c in enumerate(sx)}
    label.setdefault(r, n)
    out_axes = [label[c] for c in out]
    if gemm is None:
        rest = sorted(factors)
        w = _khatri_rao([factors[q] for q in rest]).reshape([xb.shape[q] for q in rest] + [-1])
        return np.einsum(xb, list(range(n)), w, rest + [label[r]], out_axes)
    s, e, orient, block, mkl = gemm
    library = "mkl" if mkl else "numpy"
    dims = xb.shape
    nr = next(f.shape[1] for f in factors.values())
    a, k, b = math.prod(dims[:s]), math.prod(dims[s:e]), math.prod(dims[e:])
    rest = [q for q in sorted(factors) if not s <= q < e]
    t_axes = list(range(s)) + list(range(e, n)) + [n] if orient == "rows" else \
        list(range(s)) + [n] + list(range(e, n))
    res_axes = sorted(out_axes)                                    # free axes in X's order, then r
    xp = array_module(xb)
    res = None if block == nr and not rest else xp.empty([dims[q] if q < n else nr for q in res_axes], dtype)
    fused = (xp is np and xb.flags.c_contiguous and xb.dtype == np.float64
             and _fusion(dims, s, e, orient, rest, block))       # (CPU blocks only)
    for r0 in range(0, nr, block):
        cols = slice(r0, min(nr, r0 + block))
        kr = xp.ascontiguousarray(_khatri_rao([factors[q][:, cols] for q in range(s, e)]))   # (small)
        if fused:
            h = _khatri_rao([factors[q][:, cols] for q in rest])
            res[..., cols] = _run_fused(fused, xb, s, e, rest, kr, h).reshape(res[..., cols].shape)
            del kr, h  # before the next block's
            continue
        if orient == "rows":
            t = blas.matmul(xb.reshape(a, k) if e == n else xb.reshape(a, k, b).transpose(0, 2, 1), kr, library)
        elif s == 0:
            t = blas.matmul(kr.T, xb.reshape(k, b), library)
        elif e == n:
            t = blas.matmul(kr.T, xb.reshape(a, k).T, library).T
        else:
            t = blas.matmul(kr.T, xb.reshape(a, k, b), library)
        t = t.reshape([dims[q] if q < n else -1 for q in t_axes])
        if res is None:           # T is the result: a transposed view, no copy
            return t.transpose([t_axes.index(q) for q in out_axes])
        if rest:  # the weights stored in T's axis order: einsum's inner loop runs contiguously in both
            w = _khatri_rao([factors[q][:, cols] for q in rest]).reshape([dims[q] for q in rest] + [-1])
            w_axes = [q for q in t_axes if q in rest or q == n]
            w = xp.ascontiguousarray(w.transpose([(rest + [n]).index(q) for q in w_axes]))
            # no out=: numpy's einsum then picks the output order its loops run fastest in (into a C-ordered
            # out= it took 6.7 ms instead of 0.8 here: ijk,ia,ja->ka at 256^3, R = 24); the copy is small
            res[..., cols] = xp.einsum(t, t_axes, w, w_axes, res_axes) if xp is np else \
                _hadamard_sum(xp, t, t_axes, w, w_axes, res_axes)
        else:
            res[..., cols] = xp.einsum(t, t_axes, res_axes)
        del kr, t  # before the next block's Khatri-Rao product
    return res.transpose([res_axes.index(q) for q in out_axes])


#: The GPU's Hadamard-sum kernel, made on first use (CuPy is imported only where a GPU runs).
_HADAMARD_SUM = {}


def _hadamard_sum(xp, t, t_axes, w, w_axes, res_axes):
    """``einsum(t, t_axes, w, w_axes, res_axes)`` on a GPU as one reduction kernel: CuPy's einsum would first
    make the product, an array the size of ``t``, which the footprint does not hold (``w_axes`` are in
    ``t_axes``'s order)."""
    if xp not in _HADAMARD_SUM:
        _HADAMARD_SUM[xp] = xp.ReductionKernel("T t, T w", "T y", "t * w", "a + b", "y = a", "0", "hadamard_sum")
    w = w.reshape([t.shape[p] if q in w_axes else 1 for p, q in enumerate(t_axes)])
    kept = [q for q in t_axes if q in res_axes]
    y = _HADAMARD_SUM[xp](t, w, axis=tuple(p for p, q in enumerate(t_axes) if q not in res_axes))
    return y.transpose([kept.index(q) for q in res_axes])


def _fusion(dims, s, e, orient, rest, block):
    """``"rows"``, ``"rows sum"`` or ``"cols"`` where the streaming kernels run an MTTKRP variant's GEMM and
    its Hadamard-sum in one pass (T = X times KR never stored): the Hadamard-summed modes ``rest`` lead X
    and the free ones sit next to the GEMM's, or (rows sum) the free modes lead; else None.

    * rows, X^T KR over trailing modes: X as (G, F, K): out (F, r) = sum_g (X[g] @ KR) * H[g];
    * rows sum, the same with X as (F, G, K): out[f] = sum_g (X[f] @ KR)[g] * H[g];
    * cols, KR^T X over middle modes: X as (G, K, F): out (r, F) = sum_g H[g] * (KR^T @ X[g]), F of any
      width where a column tile of X[g] (K x 24) stays in L1 while the rank rows re-read it.

    Timings: ``bench-results/mttkrp-variants-kernels.md``.

    >>> _fusion((256, 256, 256), 2, 3, "rows", [1], 24) == ("rows sum" if blas._STREAM else None)
    True
    """
    if not rest or rest != list(range(rest[0], rest[0] + len(rest))):
        return None
    g, k, n = math.prod(dims[rest[0]:rest[-1] + 1]), math.prod(dims[s:e]), len(dims)
    if orient == "cols":
        return "cols" if (rest[0] == 0 and s == len(rest) and e < n and blas.stream_kind(
            g, block, k, math.prod(dims[e:]), False, True, wide=True) == "cols") else None
    if e < n:
        return None
    if rest[0] == 0 and blas.stream_kind(g, math.prod(dims[len(rest):s]), k, block, True, False) == "rows":
        return "rows"
    if s == rest[-1] + 1 and blas.stream_kind(math.prod(dims[:rest[0]]), g, k, block, True, False) == "rows":
        return "rows sum"
    return None


def _run_fused(kind, xb, s, e, rest, kr, h):
    """The fused pass of ``_fusion``'s ``kind`` on a C-ordered float64 X and a C-ordered Khatri-Rao block
    ``kr``: (free modes x rank columns)."""
    dims, nr = xb.shape, kr.shape[1]
    g, k = math.prod(dims[rest[0]:rest[-1] + 1]), math.prod(dims[s:e])
    h = np.ascontiguousarray(h)
    if kind == "rows sum":
        f = math.prod(dims[:rest[0]])
        out = np.zeros((f, nr))
        blas.run_stream("rows sum", f, nr, f, g, nr, k, xb.ctypes.data, k, g * k, kr.ctypes.data, nr, h.ctypes.data,
                        nr, out.ctypes.data, nr)
        return out
    if kind == "rows":
        f = math.prod(dims[len(rest):s])
        out = np.zeros((f, nr))
        blas.run_stream("rows", f, nr, g, f, nr, k, xb.ctypes.data, k, f * k, kr.ctypes.data, nr, out.ctypes.data,
                        nr, 0, h.ctypes.data)
        return out
    f = math.prod(dims[e:])
    out = np.zeros((nr, f))
    blas.run_stream("cols", nr, f, g, nr, f, k, kr.ctypes.data, xb.ctypes.data, f, k * f, out.ctypes.data, f, 0,
                    h.ctypes.data)
    return out.T
