"""TTM chains on one rank's blocks: X times one matrix per contracted mode, e.g. ijklm,jb,kc,ld,me->ibcde.

STANDALONE: numpy, the standard library and the sibling runtime modules. float64 with new sides of at most
32 on the streaming kernels: the whole chain in one pass slab by slab of X's first axis (X read once; a
slab's intermediates stay in cache where they fit). Otherwise step by step: leading/trailing modes as one
GEMM, middle modes as batched GEMMs (or moved last by a transposed copy), in the order with the lowest
modeled cost; a large X slab by slab; on numpy's BLAS, GEMMs with a narrow side (<= 16 columns) in pieces
of at most 1e6 multiply-adds, which OpenBLAS runs without packing X (1.4x faster here).

>>> x, u = np.ones((4, 5, 6)), np.ones((5, 2))
>>> kind, name, params = strategy(("ijk", "jb"), "ibk", {"i": 4, "j": 5, "k": 6, "b": 2}, False)
>>> name, run(("ijk", "jb"), "ibk", [x, u], x.dtype, params).shape
('TTM chain: j (middle)', (4, 2, 6))
"""
import itertools
import math

import numpy as np

from . import blas
from .blas import matmul, route, run_stream, stream_kind
from .cost import ELEM, NARROW, SMALL_GEMM, gemm_seconds
from .libraries import array_module, transposed

#: Elements of X per slab of a TTM chain run slab by slab (a few MiB: intermediates stay in cache).
_SLAB = 1 << 20


def strategy(subs, out, sizes, stream):
    big = [n for n, s in enumerate(subs) if len(s) >= 3]
    if len(subs) < 2 or len(big) != 1 or len(set(subs[big[0]])) != len(subs[big[0]]):
        return None
    x = big[0]
    sx = subs[x]
    steps = []   # (mode, new index, operand)
    for n, s in enumerate(subs):
        if n == x:
            continue
        if len(s) != 2 or (s[0] in sx) == (s[1] in sx):
            return None
        mode, new = (s[0], s[1]) if s[0] in sx else (s[1], s[0])
        if "".join(subs).count(new) != 1 or new not in out or mode in out:
            return None
        steps.append((mode, new, n))
    contracted = {m for m, _, _ in steps}
    kept = {c for c in sx if c not in contracted}
    if len(contracted) != len(steps) or set(out) != kept | {w for _, w, _ in steps} or len(out) != len(set(out)):
        return None
    if stream:
        found = _ttm_streamed_strategy(x, sx, steps, sizes)
        if found is not None:
            return found
    # a large X whose first axis is kept runs slab by slab (intermediates stay in cache): model one slab
    size, first = math.prod(sizes[c] for c in sx), sizes[sx[0]]
    rows = max(1, _SLAB * first // size) if len(steps) > 1 and sx[0] in out and size > 2 * _SLAB else 0
    rows = rows if rows < first else 0
    dims = dict(sizes, **{sx[0]: rows}) if rows else sizes
    best = None
    for order in _step_orders(steps, sizes):
        labels, seconds, kinds, gemms = list(sx), 0.0, [], []     # gemms: (m, k, n, batches) of each step
        for mode, new, _ in order:
            q, total = labels.index(mode), math.prod(dims[c] for c in labels)
            n, w = dims[mode], dims[new]
            if q == len(labels) - 1:
                kinds.append("last")
                gemms.append((total // n, n, w, 1))
                seconds += gemm_seconds(*gemms[-1], pieces=True)
                labels[q] = new
            elif q == 0:
                kinds.append("first")
                gemms.append((total // n, n, w, 1))
                seconds += gemm_seconds(*gemms[-1], pieces=True)
                labels = labels[1:] + [new]
            else:
                after = math.prod(dims[c] for c in labels[q + 1:])
                batched = gemm_seconds(w, n, after, total // (n * after), pieces=True)
                moved = gemm_seconds(total // n, n, w, pieces=True) + 3 * ELEM * total    # a transposed copy
                kinds.append("middle" if batched <= moved else "moved last")
                gemms.append((w, n, after, total // (n * after)) if batched <= moved else (total // n, n, w, 1))
                seconds += min(batched, moved)
                labels = labels[:q] + [new] + labels[q + 1:] if batched <= moved else \
                    labels[:q] + labels[q + 1:] + [new]
        if labels != list(out):
            seconds += ELEM * math.prod(dims[c] for c in out)
        if best is None or seconds < best[0] - 1e-12:
            best = (seconds, order, kinds, gemms)
    _, order, kinds, gemms = best
    name = "TTM chain: " + ", ".join(f"{m} ({k})" for (m, _, _), k in zip(order, kinds))
    if rows:
        name += f"; in slabs of {rows} {sx[0]}"
    # as _ttm_chain calls matmul: "middle" U^T (rows strided) @ T batches, "last" and "moved last" T @ U with
    # both operands' rows in place, "first" T^T (rows strided) @ U
    streamed = [m for (m, _, _), kind, (gm, gk, gn, nb) in zip(order, kinds, gemms) if stream and kind != "first"
                and (stream_kind(nb, gm, gk, gn, False, True) == "cols" if kind == "middle"
                     else stream_kind(nb, gm, gk, gn, False, False) is not None)]
    if streamed:
        name += f"; streamed GEMMs: {', '.join(streamed)}"
    if route("ttm") == "numpy" and any(m * k * n > SMALL_GEMM and min(m, n) <= NARROW
                                       for (m, k, n, _), (mode, _, _) in zip(gemms, order) if mode not in streamed):
        name += "; narrow GEMMs in pieces of <= 1e6 multiply-adds (float)"
    return "ttm", name, (x, tuple(order), tuple(kinds), rows)


def _step_orders(steps, sizes):
    """The orders a TTM chain's ``steps`` (mode, new index, operand) are tried in: all of them up to 6
    steps, beyond that the one that shrinks the tensor fastest first."""
    if len(steps) <= 6:
        return itertools.permutations(steps)
    return [sorted(steps, key=lambda t: sizes[t[1]] / sizes[t[0]])]


def _ttm_streamed_strategy(x, sx, steps, sizes):
    """The whole chain in one pass of the streaming kernels (``ttm_chain`` in ``_stream.c``), slab by slab
    of X's first axis where it is kept: float64 on the CPU, every new side at most 32 wide, intermediates of
    one slab at most ``_SLAB`` elements, ``blas._STREAM_WORK`` multiply-adds in all; else None. The order
    has the fewest multiply-adds counted in whole vectors of 8 (ties: X's order, which streams X by columns),
    among those whose steps each read whole vectors (a mode product over a run of 2..7 trailing elements
    lost to BLAS: 9.9 ms against 8.4 on a 2000 x 600 x 3 X)."""
    if blas._STREAM is None or any(sizes[new] > blas._STREAM_NARROW for _, new, _ in steps):
        return None
    slab = sx[1:] if sx[0] not in {m for m, _, _ in steps} else sx
    steps = sorted(steps, key=lambda t: sx.index(t[0]))      # (ties: X's order, whatever the operands' order)
    best = None
    for order in _step_orders(steps, sizes):
        dims, work, largest = [sizes[c] for c in slab], 0, 0
        for mode, new, _ in order:
            q = slab.index(mode)
            a, n, b, w = math.prod(dims[:q]), dims[q], math.prod(dims[q + 1:]), sizes[new]
            if 1 < b < 8:
                break
            work += a * n * (-(-b // 8) * 8 * w if b > 1 else -(-w // 8) * 8)
            dims[q] = w
            largest = max(largest, math.prod(dims))
        else:
            if best is None or work < best[0]:
                best = (work, order, largest)
    if best is None:
        return None
    work, order, largest = best
    slabs = sizes[sx[0]] if slab != sx else 1
    if work * slabs < max(1, blas._STREAM_WORK) or largest > _SLAB:
        return None
    name = f"TTM chain: {', '.join(m for m, _, _ in order)} in one streamed pass"
    return "ttm streamed", name + (f", {sx[0]} by {sx[0]}" if slabs > 1 else ""), (x, tuple(order), slab != sx)


def run_streamed(subs, out, blocks, dtype, params):
    """The chain on ``ttm_chain``: X (C-ordered: see ``contract_group``) read once, in place."""
    x, order, slabbed = params
    xb = blocks[x]
    labels = list(subs[x][1:] if slabbed else subs[x])
    dims, shape, mats = [], list(xb.shape[1:] if slabbed else xb.shape), []
    for mode, new, n in order:
        q = labels.index(mode)
        u = blocks[n] if subs[n][0] == mode else blocks[n].T
        mats.append(np.ascontiguousarray(u))                    # (n_mode, n_new), C order
        dims += [math.prod(shape[:q]), shape[q], math.prod(shape[q + 1:]), u.shape[1]]
        labels[q], shape[q] = new, u.shape[1]
    slabs = xb.shape[0] if slabbed else 1
    res = np.empty((slabs, *shape) if slabbed else shape)
    dims, ptrs = np.array(dims, dtype=np.int64), np.array([m.ctypes.data for m in mats], dtype=np.uintp)
    run_stream("chain", slabs, res.size // slabs, slabs, len(order), dims.ctypes.data, ptrs.ctypes.data,
               xb.ctypes.data, xb.size // slabs, res.ctypes.data, res.size // slabs)
    labels = [subs[x][0]] + labels if slabbed else labels
    return res.transpose([labels.index(c) for c in out])


def run(subs, out, blocks, dtype, params):
    """The chain on X, or slab by slab of X's first axis (kept) so intermediates stay in cache (CPU only:
    a GPU runs the whole chain, its small slab GEMMs would cost more in launches than they save)."""
    x, order, kinds, rows = params
    xb = blocks[x]
    if not rows or array_module(xb) is not np:
        t, labels = _ttm_chain(xb, list(subs[x]), subs, blocks, order, kinds)
        return t.transpose([labels.index(c) for c in out])   # a view: the consumer reads it as it lies
    res = None
    for r0 in range(0, xb.shape[0], rows):
        t, labels = _ttm_chain(xb[r0:r0 + rows], list(subs[x]), subs, blocks, order, kinds)
        if res is None:
            res = np.empty((xb.shape[0],) + t.shape[1:], dtype=t.dtype)
        res[r0:r0 + rows] = t
    return res.transpose([labels.index(c) for c in out])


def _ttm_chain(t, labels, subs, blocks, order, kinds):
    library = route("ttm")
    for (mode, new, n), kind in zip(order, kinds):
        u = blocks[n] if subs[n][0] == mode else blocks[n].T       # (n_mode, n_new)
        u = array_module(u).ascontiguousarray(u)
        q, dims = labels.index(mode), t.shape
        if kind == "last":
            t = matmul(t.reshape(-1, dims[q]), u, library).reshape(dims[:q] + (u.shape[1],))
            labels[q] = new
        elif kind == "first":
            t = matmul(t.reshape(dims[0], -1).T, u, library).reshape(dims[1:] + (u.shape[1],))
            labels = labels[1:] + [new]
        elif kind == "middle":
            t = matmul(u.T, t.reshape(math.prod(dims[:q]), dims[q], -1), library)
            t = t.reshape(dims[:q] + (u.shape[1],) + dims[q + 1:])
            labels[q] = new
        else:  # moved last
            perm = [d for d in range(len(dims)) if d != q] + [q]
            t = matmul(transposed(t, perm).reshape(-1, dims[q]), u, library)
            t = t.reshape(tuple(dims[d] for d in perm[:-1]) + (u.shape[1],))
            labels = labels[:q] + labels[q + 1:] + [new]
    return t, labels


