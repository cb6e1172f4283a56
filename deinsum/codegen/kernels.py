"""Local (single-rank) kernels: one binary or unary einsum step on numpy blocks.

STANDALONE: this file imports only numpy (pytblis optionally). Its source is
pasted verbatim into emitted scripts, and the sequential executor and the
distributed runtime call the same functions, so there is one copy of the
local compute logic.

Index strings may hold any characters; they are mapped to ASCII letters here.

>>> import numpy as np
>>> a, b = np.arange(6.).reshape(2, 3), np.arange(12.).reshape(3, 4)
>>> bool(np.allclose(contract_pair(a, b, "ij", "jk", "ik"), a @ b))
True
>>> float(unary(np.eye(3), "ii", ""))
3.0
"""
import numpy as np

try:  # optional fast transposes (the `fast` extra)
    import pytblis as _tblis
except ImportError:  # pragma: no cover - depends on the environment
    _tblis = None

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
    * no contracted index (KRP, Hadamard, outer) -> broadcast multiply.
    """
    batch = [c for c in sa if c in sb and c in out]
    summed = [c for c in sa if c in sb and c not in out]
    free_a = [c for c in sa if c not in sb]
    free_b = [c for c in sb if c not in sa]
    if not summed:
        # broadcast multiply: result axes batch + free_a + free_b
        order = batch + free_a + free_b
        ea = np.expand_dims(a.transpose([sa.index(c) for c in batch + free_a]),
                            tuple(range(len(batch) + len(free_a), len(order))))
        bb = b.transpose([sb.index(c) for c in batch + free_b])
        eb = np.expand_dims(bb, tuple(range(len(batch), len(batch) + len(free_a))))
        res = ea * eb
    elif not batch:
        # order the contracted indices as the larger operand stores them
        big, sbig = (a, sa) if a.size >= b.size else (b, sb)
        summed = [c for c in sbig if c in summed]
        am = _matrix(a, sa, free_a, summed, rows_free=True)
        bm = _matrix(b, sb, free_b, summed, rows_free=False)
        order = free_a + free_b
        res = np.matmul(am, bm).reshape([a.shape[sa.index(c)] for c in free_a] +
                                         [b.shape[sb.index(c)] for c in free_b])
    else:
        shape = dict(zip(sa, a.shape))
        shape.update(zip(sb, b.shape))
        nb, na, nk, nn = (int(np.prod([shape[c] for c in g], dtype=np.int64))
                          for g in (batch, free_a, summed, free_b))
        if min(na, nn) < 8:  # memory-bound (batched GEMV-like): one pass, no transposed copies
            ea, eb, eo = _ascii_map(sa, sb, out)
            return np.einsum(f"{ea},{eb}->{eo}", a, b)
        am = a.transpose([sa.index(c) for c in batch + free_a + summed]).reshape(nb, na, nk)
        bm = b.transpose([sb.index(c) for c in batch + summed + free_b]).reshape(nb, nk, nn)
        order = batch + free_a + free_b
        res = np.matmul(am, bm).reshape([shape[c] for c in order])
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
        m = x.transpose(perm_f).reshape((ns, nf) if rows_free else (nf, ns))
        return m.T
    return x.transpose(perm_d).reshape((nf, ns) if rows_free else (ns, nf))


def contiguous(a):
    """C-contiguous copy of ``a`` (TBLIS transpose when installed and useful)."""
    if a.flags.c_contiguous:
        return a
    if _tblis is not None and a.ndim > 1 and a.size >= 4096 and a.dtype.kind in "fc":
        perm = [int(k) for k in np.argsort(a.strides, kind="stable")[::-1]]
        src = a.transpose(perm)
        if src.flags.c_contiguous:  # a is a pure transpose of contiguous data
            letters = _ASCII[:a.ndim]
            out = np.empty(a.shape, dtype=a.dtype)
            _tblis.transpose_add("".join(letters[p] for p in perm) + "->" + letters, src, out=out)
            return out
    return np.ascontiguousarray(a)
