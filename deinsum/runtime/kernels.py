"""Local (single-rank) kernels: a fused group's einsum, or one binary/unary step, on numpy blocks
(or CuPy blocks on a GPU: see ``libraries.array_module``).

STANDALONE: numpy, the standard library and the sibling runtime modules; the sequential executor and the
distributed runtime call the same functions. ``contract_group`` computes a fused group's statement on this
rank's blocks (a partial sum where the grid splits a summed index) with the fastest strategy the cost model
(``cost.py``) finds, ``group_strategy`` names it: MTTKRP (``mttkrp.py``), a TTM chain (``ttm.py``), or
numpy's einsum path, each step through ``contract_pair``. Every GEMM runs through ``blas.matmul`` as routed.
Results may be transposed views (a consumer relabels them, no copy). Peak memory stays within 1.5x of inputs
plus output except in the pairwise fallback and in TTM chains whose first steps grow the tensor.

Index strings may hold any characters; they are mapped to ASCII letters where numpy needs them.

>>> import numpy as np
>>> a, b = np.arange(6.).reshape(2, 3), np.arange(12.).reshape(3, 4)
>>> bool(np.allclose(contract_pair(a, b, "ij", "jk", "ik"), a @ b))
True
>>> float(unary(np.eye(3), "ii", ""))
3.0
>>> x, f = np.ones((4, 5, 6)), np.ones((5, 3))
>>> contract_group(("ijk", "ja", "ka"), "ia", x, f, np.ones((6, 3)))[0].tolist()
[30.0, 30.0, 30.0]
>>> group_strategy(("ijklm", "ia", "ja", "la", "ma"), "ka", [(24,) * 5] + [(24, 24)] * 4).split(": GEMM")[0]
'MTTKRP to (k)'
"""
from functools import lru_cache

import numpy as np

from . import mttkrp, ttm
from .blas import matmul, mkl_routed, routes_epoch
from .libraries import array_module, transposed


_ASCII = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _ascii_map(*subscripts):
    """Map the characters of ``subscripts`` onto ASCII letters for numpy."""
    chars = sorted(set("".join(subscripts)))
    if len(chars) > len(_ASCII):
        raise ValueError(f"a local step uses {len(chars)} distinct indices; at most 52 are supported")
    table = {c: _ASCII[n] for n, c in enumerate(chars)}
    return ["".join(table[c] for c in s) for s in subscripts]



def reference_einsum(equation, *operands):
    """``numpy.einsum`` of an explicit equation whose letters numpy may not accept."""
    lhs, out = equation.split("->")
    *subs, o = _ascii_map(*lhs.split(","), out)
    return np.einsum(",".join(subs) + "->" + o, *operands)


def unary(a, sub, out):
    """Diagonal extraction, sums and transposes of one operand: ``einsum(sub->out)``.

    Size-1 axes whose index is not in ``out`` are broadcast away (numpy semantics).
    """
    s, o = _ascii_map(sub, out)
    return np.einsum(f"{s}->{o}", a)



def contract_pair(a, b, sa, sb, out):
    """Binary step ``einsum(sa,sb->out)`` through BLAS where it applies.

    * contraction without batch indices -> one GEMM on matrix views (GEMM/TDOT);
    * batch and contracted indices -> batched ``matmul`` (``einsum`` when GEMV-like);
    * no contracted index (KRP, Hadamard, outer) -> broadcast multiply into a C-ordered result (a move of it
      copies nothing the footprint does not hold).
    """
    batch = [c for c in sa if c in sb and c in out]
    summed = [c for c in sa if c in sb and c not in out]
    free_a = [c for c in sa if c not in sb]
    free_b = [c for c in sb if c not in sa]
    if not summed:
        order = batch + free_a + free_b
        ea = np.expand_dims(a.transpose([sa.index(c) for c in batch + free_a]),
                            tuple(range(len(batch) + len(free_a), len(order))))
        eb = np.expand_dims(b.transpose([sb.index(c) for c in batch + free_b]),
                            tuple(range(len(batch), len(batch) + len(free_a))))
        xp = array_module(a, b)
        shape = np.broadcast_shapes(ea.shape, eb.shape)
        res = xp.empty([shape[order.index(c)] for c in out], dtype=xp.result_type(a, b))
        xp.multiply(ea, eb, out=res.transpose([out.index(c) for c in order]))   # (seen in the operands' order)
        return res
    if not batch:
        # order the contracted indices as the larger operand stores them
        big, sbig = (a, sa) if a.size >= b.size else (b, sb)
        summed = [c for c in sbig if c in summed]
        am = _matrix(a, sa, free_a, summed, rows_free=True)
        bm = _matrix(b, sb, free_b, summed, rows_free=False)
        order = free_a + free_b
        res = matmul(am, bm).reshape([a.shape[sa.index(c)] for c in free_a] +
                                      [b.shape[sb.index(c)] for c in free_b])
    else:
        shape = dict(zip(sa, a.shape))
        shape.update(zip(sb, b.shape))
        nb, na, nk, nn = (int(np.prod([shape[c] for c in g], dtype=np.int64))
                          for g in (batch, free_a, summed, free_b))
        if min(na, nn) < 8:  # memory-bound (batched GEMV-like): one pass, no transposed copies
            ea, eb, eo = _ascii_map(sa, sb, out)
            return np.einsum(f"{ea},{eb}->{eo}", a, b)
        am = transposed(a, [sa.index(c) for c in batch + free_a + summed]).reshape(nb, na, nk)
        bm = transposed(b, [sb.index(c) for c in batch + summed + free_b]).reshape(nb, nk, nn)
        order = batch + free_a + free_b
        res = matmul(am, bm).reshape([shape[c] for c in order])
    return res.transpose([order.index(c) for c in out])


def _matrix(x, sub, free, summed, rows_free):
    """``x`` as a (free x summed) matrix if ``rows_free`` else (summed x free).

    Of the two memory orders that give such a matrix (directly, or as the
    transpose of the other), take a zero-copy view when one exists, else the
    order whose copy keeps ``x``'s innermost axis innermost (a fast copy).
    """
    nf = int(np.prod([x.shape[sub.index(c)] for c in free], dtype=np.int64))
    ns = int(np.prod([x.shape[sub.index(c)] for c in summed], dtype=np.int64))
    direct = free + summed if rows_free else summed + free
    flipped = summed + free if rows_free else free + summed
    perm_d = [sub.index(c) for c in direct]
    perm_f = [sub.index(c) for c in flipped]
    identity = list(range(len(sub)))
    use_flipped = perm_f == identity or (perm_d != identity and sub and perm_f[-1] == len(sub) - 1
                                         and perm_d[-1] != len(sub) - 1)
    if use_flipped:
        return transposed(x, perm_f).reshape((ns, nf) if rows_free else (nf, ns)).T
    return transposed(x, perm_d).reshape((nf, ns) if rows_free else (ns, nf))


def group_strategy(inputs, output, shapes, dtype=np.float64, device=False):
    """The name of the strategy ``contract_group`` uses for these subscripts, block shapes and dtype (on
    the CPU, or on a GPU with ``device``).

    >>> group_strategy(("ij", "jk"), "ik", [(4, 5), (5, 6)])
    'pairwise: ij,jk->ik'
    >>> name = group_strategy(("ijklm", "jb", "kc", "ld", "me"), "ibcde", [(24,) * 5] + [(24, 8)] * 4, np.float32)
    >>> name.split("; ")[:2]
    ['TTM chain: j (middle), k (middle), l (middle), m (last)', 'in slabs of 3 i']
    >>> name.split("; ")[2]
    'narrow GEMMs in pieces of <= 1e6 multiply-adds (float)'
    """
    return _strategy(tuple(inputs), output, tuple(tuple(int(n) for n in s) for s in shapes),
                     mkl_routed("narrow", dtype) and not device, np.dtype(dtype).itemsize,
                     np.dtype(dtype) == np.float64 and not device, routes_epoch())[1]


def contract_group(inputs, output, *blocks):
    """``einsum(inputs -> output)`` of one fused group on this rank's blocks (see module docstring).

    >>> x = np.arange(24.).reshape(2, 3, 4)
    >>> u, v = np.ones((3, 2)), np.ones((4, 5))
    >>> contract_group(("ijk", "jb", "kc"), "ibc", x, u, v).shape
    (2, 2, 5)
    """
    inputs = tuple(inputs)
    if len(inputs) != len(blocks):
        raise ValueError(f"{len(inputs)} subscripts but {len(blocks)} blocks")
    xp = array_module(*blocks)
    dtype = xp.result_type(*blocks)
    blocks = [xp.asarray(b, dtype=dtype) for b in blocks]
    # a block stored as a permutation of C order becomes a C-ordered view with permuted subscripts
    subs = []
    for n, (b, s) in enumerate(zip(blocks, inputs)):
        if b.ndim > 1 and not b.flags.c_contiguous:
            perm = sorted(range(b.ndim), key=lambda d: -abs(b.strides[d]))
            if b.transpose(perm).flags.c_contiguous:
                b, s = b.transpose(perm), "".join(s[d] for d in perm)
        blocks[n] = b
        subs.append(s)
    # the streaming kernels' passes read C-ordered blocks (as a plan's are: group_strategy names those)
    stream = dtype == np.float64 and xp is np and all(b.flags.c_contiguous for b in blocks)
    mkl = mkl_routed("narrow", dtype) and xp is np
    kind, _, params = _strategy(tuple(subs), output, tuple(b.shape for b in blocks), mkl,
                                dtype.itemsize, stream, routes_epoch(), tuple(map(_bounds, blocks)))
    return _RUN[kind](subs, output, blocks, dtype, params)


def _bounds(block):
    """The axes c of a block whose axis c - 1 a reshape cannot merge with c without a copy.

    >>> _bounds(np.ones((4, 5, 6))[:2, :3])
    (1,)
    """
    shape, strides = block.shape, block.strides
    return tuple(c for c in range(1, block.ndim)
                 if shape[c - 1] > 1 and shape[c] > 1 and strides[c - 1] != shape[c] * strides[c])


@lru_cache(maxsize=256)
def _strategy(subs, out, shapes, mkl, itemsize=8, stream=False, epoch=None, bounds=None):
    """(kind, name, params) for ``contract_group``; pure function of subscripts, shapes, whether MKL
    can run the GEMMs (float32/64 on the CPU, where installed), the bytes per element, whether the
    blocks are float64 on the CPU (the streaming kernels' domain, where built: ``blas.stream_kind``),
    the routes in force (``epoch``: ``blas.routes_epoch()``, only a key of the cache), ``_bounds`` per block."""
    sizes = {}
    for s, shape in zip(subs, shapes):
        if len(s) != len(shape):
            raise ValueError(f"subscripts {s!r} do not match a block of shape {shape}")
        for c, n in zip(s, shape):
            if sizes.setdefault(c, n) != n:
                return "einsum", "einsum (broadcast sizes)", None
    if 0 in sizes.values():
        return "zeros", "zeros (an empty block)", tuple(sizes[c] for c in out)
    found = (mttkrp.strategy(subs, out, sizes, mkl, itemsize, stream, bounds or ((),) * len(subs))
             or ttm.strategy(subs, out, sizes, stream))
    if found is not None:
        return found
    return _pairwise_strategy(subs, out, sizes)


# ---------------------------------------------------------------------------------------------
# everything else: numpy's einsum path, one contract_pair per step
# ---------------------------------------------------------------------------------------------
def _pairwise_strategy(subs, out, sizes):
    # indices needed by no other operand and not by the output are summed first (unary)
    kept = []
    for n, s in enumerate(subs):
        elsewhere = out + "".join(subs[:n] + subs[n + 1:])
        kept.append("".join(dict.fromkeys(c for c in s if c in elsewhere)))
    path = ()
    if len(kept) > 1:
        letters = _ascii_map(*kept, out)
        views = [np.broadcast_to(np.zeros(()), tuple(sizes[c] for c in s)) for s in kept]
        path = tuple(tuple(step) for step in np.einsum_path(
            ",".join(letters[:-1]) + "->" + letters[-1], *views,
            optimize="optimal" if len(kept) <= 4 else "greedy")[0][1:])
    return "pairwise", f"pairwise: {','.join(subs)}->{out}", (tuple(kept), path)


def _run_pairwise(subs, out, blocks, dtype, params):
    kept, path = params
    ops = [(k, b if k == s else unary(b, s, k)) for s, k, b in zip(subs, kept, blocks)]
    for step in path:
        group = [ops.pop(i) for i in sorted(step, reverse=True)]
        while len(group) > 1:  # numpy's path may join more than two operands in one step
            (sa, a), (sb, b) = group.pop(), group.pop()
            needed = out + "".join(s for s, _ in ops + group)
            batch = [c for c in sa if c in sb and c in needed]
            res = "".join(batch + [c for c in sa if c not in sb] + [c for c in sb if c not in sa])
            if not ops and not group and sorted(res) == sorted(out):   # the last step: made in the result's order
                res = out
            group.append((res, contract_pair(a, b, sa, sb, res)))
        ops += group
    (s, res), = ops
    return res if s == out else unary(res, s, out)


def _run_zeros(subs, out, blocks, dtype, shape):
    return array_module(*blocks).zeros(shape, dtype=dtype)


def _run_einsum(subs, out, blocks, dtype, params):
    return reference_einsum(",".join(subs) + "->" + out, *blocks)


_RUN = {"mttkrp": mttkrp.run, "ttm": ttm.run, "ttm streamed": ttm.run_streamed, "pairwise": _run_pairwise,
        "zeros": _run_zeros, "einsum": _run_einsum}
