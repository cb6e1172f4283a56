"""Local group kernels (deinsum/runtime/kernels.py): every strategy equals numpy.einsum, memory stays bounded."""
import glob
import itertools
import json
import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deinsum.peak import mttkrp_runs
from deinsum.runtime import blas as B
from deinsum.runtime import gemm as G
from deinsum.runtime import kernels as K
from deinsum.runtime import libraries as L
from deinsum.runtime import mttkrp as M
from deinsum.runtime import ttm as T
from deinsum.runtime.kernels import contract_group, group_strategy

DTYPES = [np.float32, np.float64, np.complex64, np.complex128, np.int64]

MTTKRP = {  # every mode of orders 3 and 5 (uneven sizes)
    **{f"O3-M{m}": ("ijk," + ",".join(f"{c}a" for c in "ijk" if c != "ijk"[m]) + f"->{'ijk'[m]}a",
                    dict(i=7, j=6, k=5, a=3)) for m in range(3)},
    **{f"O5-M{m}": ("ijklm," + ",".join(f"{c}a" for c in "ijklm" if c != "ijklm"[m]) + f"->{'ijklm'[m]}a",
                    dict(i=5, j=4, k=3, l=4, m=2, a=3)) for m in range(5)},
}
TTMC = ("ijklm,jb,kc,ld,me->ibcde", dict(i=5, j=4, k=3, l=4, m=3, b=2, c=3, d=2, e=2))
#: The streaming kernels in ``blas._STREAM``'s order (then set_threads, build).
KINDS = ("rows", "cols", "chain", "rows sum")


def operands(eq, sizes, dtype, seed=0):
    rng = np.random.default_rng(seed)
    shapes = [[sizes[c] for c in t] for t in eq.split("->")[0].split(",")]
    if np.dtype(dtype).kind == "i":
        return [rng.integers(-3, 4, size=s).astype(dtype) for s in shapes]
    ops = [rng.standard_normal(s) + (1j * rng.standard_normal(s) if np.dtype(dtype).kind == "c" else 0)
           for s in shapes]
    return [np.asarray(o, dtype=dtype) for o in ops]


def check(eq, ops, result):
    ref = np.einsum(eq, *ops)
    assert result.shape == ref.shape and result.dtype == ref.dtype
    if ref.dtype.kind == "i":
        np.testing.assert_array_equal(result, ref)
    else:
        tol = 2e-4 if ref.dtype in (np.float32, np.complex64) else 1e-10
        np.testing.assert_allclose(result, ref, rtol=tol, atol=tol * max(1.0, float(np.abs(ref).max(initial=0))))


def split(eq):
    lhs, out = eq.split("->")
    return lhs.split(","), out


# ---- MTTKRP: every variant (GEMM run x orientation) and rank blocking -------------------------------
PARTIAL = {  # the groups the planner makes of MTTKRP-O5 (partial MTTKRP, then a Hadamard-sum)
    "partial": ("ja,ka,ijklm->ilma", dict(i=5, j=4, k=3, l=4, m=2, a=3)),
    "hadamard": ("la,ma,ilma->ia", dict(i=5, l=4, m=2, a=3)),
    "two-free": ("ijkl,ia,ka->ajl", dict(i=5, j=4, k=3, l=4, a=3)),
    "wide": ("ijk,ia,ja->ka", dict(i=3, j=5, k=45, a=3)),      # the fused KR^T X pass over 45 > 32 columns
    "few-free": ("ijkl,ja,ka,la->ia", dict(i=2, j=5, k=3, l=9, a=3)),   # rows sum: fewer free rows than threads
    "wide-rank": ("ijk,ja,ka->ia", dict(i=3, j=4, k=5, a=40)),   # rows sum in two blocks of 20 rank columns
}


@pytest.fixture(params=["blas", "streamed", "streamed, 3 threads"])
def gemms(request, monkeypatch):
    """Every GEMM on BLAS (these sizes are below the streaming kernels' threshold), or every float64 GEMM
    the streaming kernels can read on them (threshold 0), on one thread or three; yields the kernels'
    calls: (kind, fused: GEMM and Hadamard-sum in one pass)."""
    calls = []
    if request.param.startswith("streamed"):
        if B._STREAM is None:
            pytest.skip("streaming kernels not built here (no C compiler at install), no AVX-512, or DEINSUM_GEMM=numpy")
        monkeypatch.setattr(B, "_STREAM", tuple(
            (lambda f, kind: lambda *args: calls.append((kind, kind == "rows sum" or args[-1] is not None))
             or f(*args))(f, kind) for f, kind in zip(B._STREAM, KINDS)) + B._STREAM[4:])
        monkeypatch.setattr(B, "_STREAM_WORK", 0)
        B.set_stream_threads(3 if request.param.endswith("threads") else 1)
    K._strategy.cache_clear()       # strategy names say which GEMMs stream
    yield calls
    K._strategy.cache_clear()
    B.set_stream_threads(1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(MTTKRP) + list(PARTIAL))
def test_mttkrp_every_variant_equals_numpy(name, dtype, gemms):
    eq, sizes = MTTKRP.get(name) or PARTIAL[name]
    subs, out = split(eq)
    ops = operands(eq, sizes, dtype)
    kind, strategy, (x, r, gemm) = K._strategy(tuple(subs), out, tuple(o.shape for o in ops), False)
    free = [c for c in subs[x] if c in out and c != "a"]
    assert kind == "mttkrp" and strategy.startswith(f"MTTKRP to ({','.join(free)}): ")
    check(eq, ops, contract_group(subs, out, *ops))
    if gemm is None:
        assert name == "hadamard"
        return
    axes = [q for q, c in enumerate(subs[x]) if c not in out]
    variants = M._variants(mttkrp_runs(len(subs[x]), axes))
    assert len(variants) >= 2
    dims, rest, nr = ops[x].shape, [q for q, c in enumerate(subs[x]) if c not in out], sizes["a"]
    for (s, e, orient), mkl in itertools.product(variants, (False, True)):   # (MKL where installed)
        for block in (3, 2, 1):                       # all rank columns at once, uneven and single blocks
            before = len(gemms)
            check(eq, ops, M.run(subs, out, ops, np.dtype(dtype), (x, r, (s, e, orient, block, mkl))))
            fused = M._fusion(dims, s, e, orient, [q for q in rest if not s <= q < e], block)
            streams = dtype == np.float64 and (bool(fused) or M._variant_streams(dims, s, e, orient, block))
            if nr % block == 0:   # (a last, narrower block may take another kernel than the name's)
                assert bool(gemms[before:]) == streams, (s, e, orient, block, gemms[before:])   # what names say runs
    fused = {kind for kind, weighted in gemms if weighted}   # GEMM and Hadamard-sum in one pass
    expected = {"O3-M0": {"rows sum"}, "O3-M1": {"rows"}, "O3-M2": {"cols"}, "O5-M0": {"rows sum"}, "O5-M1": {"rows"},
                "O5-M2": {"rows"}, "O5-M3": {"rows"}, "O5-M4": {"cols"}, "wide": {"cols"},
                "few-free": {"rows sum"}, "wide-rank": {"rows sum"}}.get(name, set())
    assert fused == (expected if dtype == np.float64 and B._STREAM_WORK == 0 else set()), (name, gemms)


@pytest.mark.parametrize("name", ["O3-M1", "O3-M2", "O5-M4"])
def test_strided_blocks_take_the_blas_strategy(name, gemms):
    """A strided X (not C-ordered: the fused passes cannot read it) takes the strategy BLAS runs: the result
    equals numpy's and no fused pass reads X."""
    eq, sizes = MTTKRP[name]
    subs, out = split(eq)
    ops = operands(eq, sizes, np.float64)
    ops[0] = operands(eq, {c: 2 * n for c, n in sizes.items()}, np.float64)[0][tuple(slice(None, n) for n in ops[0].shape)]
    check(eq, ops, contract_group(subs, out, *ops))
    assert not any(weighted for _, weighted in gemms)


@pytest.mark.parametrize("eq", ["kji,ia,ka->ja", "ijk,ai,ja->ak", "ijkl,la,ia,ja->ak", "abc,ax,cx->xb"])
def test_mttkrp_any_index_order(eq):
    subs, out = split(eq)
    sizes = {c: 2 + n for n, c in enumerate(sorted(set(eq) - set(",->")))}
    ops = operands(eq, sizes, np.float64)
    assert group_strategy(subs, out, [o.shape for o in ops]).startswith("MTTKRP")
    check(eq, ops, contract_group(subs, out, *ops))


# ---- TTM chains: every order and middle-mode kind -----------------------------------------------------
def ttm_plans(subs, sizes):
    """Every (order, kinds) the TTM kernel can run: middle modes batched or moved last."""
    x = 0
    steps = [(s[0] if s[0] in subs[0] else s[1], s[1] if s[0] in subs[0] else s[0], n)
             for n, s in enumerate(subs) if n]
    for order in itertools.permutations(steps):
        for middle in itertools.product(("middle", "moved last"), repeat=len(order)):
            labels, kinds = list(subs[x]), []
            for (mode, new, _), m in zip(order, middle):
                q = labels.index(mode)
                kind = "last" if q == len(labels) - 1 else "first" if q == 0 else m
                kinds.append(kind)
                labels = (labels[:q] + [new] + labels[q + 1:] if kind in ("last", "middle")
                          else labels[:q] + labels[q + 1:] + [new])
            yield x, order, tuple(kinds)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ttmc_every_order_equals_numpy(dtype):
    eq, sizes = TTMC
    subs, out = split(eq)
    ops = operands(eq, sizes, dtype)
    assert group_strategy(subs, out, [o.shape for o in ops]).startswith("TTM chain")
    check(eq, ops, contract_group(subs, out, *ops))
    plans = set(ttm_plans(subs, sizes))
    assert len(plans) > 24
    for params in plans:
        for rows in (0, 1, 2):
            check(eq, ops, T.run(subs, out, ops, np.dtype(dtype), params + (rows,)))


@pytest.mark.parametrize("eq", ["ijk,ia,kb->bja", "ijk,ai,bj,ck->cab", "ijkl,jb,lc->bick", "ijklm,jb->iklmb",
                                "kc,iklmb->cilmb", "ld,cilmb->dcimb", "me,dcimb->ibcde"])
def test_ttm_chain_variants(eq):
    subs, out = split(eq)
    sizes = {c: 3 + n for n, c in enumerate(sorted(set(eq) - set(",->")))}
    ops = operands(eq, sizes, np.complex128)
    assert group_strategy(subs, out, [o.shape for o in ops]).startswith("TTM chain")
    check(eq, ops, contract_group(subs, out, *ops))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("eq", ["ijk,jb->ibk", "ijk,kb->ijb", "ijk,ib->bjk", "ijk,bj->kbi"])
def test_ttm_steps_in_small_gemm_pieces(eq, dtype):
    """Steps above 1e6 multiply-adds run in pieces (float dtypes; uneven last piece): middle, last, first."""
    sizes = dict(i=3, j=24, k=6001, b=8)
    subs, out = split(eq)
    ops = operands(eq, sizes, dtype)
    assert group_strategy(subs, out, [o.shape for o in ops]).startswith("TTM chain")
    check(eq, ops, contract_group(subs, out, *ops))


# ---- GEMMs: MKL where installed, numpy's BLAS otherwise ----------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_equals_numpy_for_any_operand_layout(dtype):
    """``_matmul`` (MKL's strided-batch GEMM where installed) equals ``@``: transposed, strided, reversed
    and broadcast operands, batches that one stride cannot step through, size-1 and size-0 axes."""
    rng = np.random.default_rng(0)
    mats = lambda *shape: rng.standard_normal(shape).astype(dtype)
    cases = []
    for (m, k, n), (ba, bb), (ta, tb) in itertools.product(
            [(3, 4, 5), (1, 4, 5), (3, 1, 1), (3, 0, 5), (0, 4, 5), (30, 20, 10)],
            [((), ()), ((2,), ()), ((), (2,)), ((2, 3), (3,)), ((2, 1), (1, 3))], [(0, 0), (0, 1), (1, 0), (1, 1)]):
        cases.append((np.swapaxes(mats(*ba, k, m), -1, -2) if ta else mats(*ba, m, k),
                      np.swapaxes(mats(*bb, n, k), -1, -2) if tb else mats(*bb, k, n)))
    x = mats(4, 5, 6, 7)
    cases += [(x[:, ::2, 1:], mats(7, 3)), (x[:, ::-1], mats(7, 3)), (x.transpose(1, 0, 2, 3), mats(7, 3)),
              (mats(3, 6), x[..., ::3])]
    for a, b in cases:
        res, ref = B.matmul(a, b), a @ b
        assert res.shape == ref.shape and res.dtype == ref.dtype
        np.testing.assert_allclose(res, ref, rtol=1e-4, atol=1e-4)


def test_mkl_runs_the_gemms_it_can_read_in_place(monkeypatch):
    """Plain, transposed, interleaved and broadcast batches reach MKL; reversed strides and other dtypes go to
    numpy; a complex MTTKRP is never modeled on MKL."""
    if not L._GEMM:
        pytest.skip("MKL not installed here (the mkl wheel of the `fast` extra), or DEINSUM_GEMM=numpy")
    calls = []
    counted = {dtype: (lambda gemm: lambda *args: calls.append(gemm(*args)))(gemm) for dtype, gemm in L._GEMM.items()}
    monkeypatch.setattr(L, "_GEMM", counted)
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((4, 6, 5)), rng.standard_normal((5, 3))
    interleaved = np.lib.stride_tricks.sliding_window_view(rng.standard_normal((9, 5)), (6, 5))[:, 0]
    cases = [(x, w, True, 1), (x.transpose(0, 2, 1)[:, :, :5], w[:5], True, 1), (interleaved, w, True, 1),
             (w.T, x.transpose(0, 2, 1), True, 1), (x.astype(np.float32), w.astype(np.float32), True, 1),
             (x[:, ::-1], w, True, 0), (x.astype(complex), w, True, 0), (x, w, False, 0)]
    for a, b, mkl, expected in cases:
        before = len(calls)
        np.testing.assert_allclose(B.matmul(a, b, "mkl" if mkl else "numpy"), a @ b, rtol=1e-5)
        assert len(calls) - before == expected, (a.shape, a.strides, a.dtype, mkl)
    eq, sizes = MTTKRP["O5-M0"]
    subs, out = split(eq)
    shapes = [[sizes[c] * 4 for c in t] for t in subs]
    assert "(MKL)" not in group_strategy(subs, out, shapes, np.complex128)
    assert "(MKL)" not in group_strategy(subs, out, shapes, device=True)


@pytest.fixture(params=[1, 3], ids=["1 thread", "3 threads"])
def stream_threads(request):
    """The streaming kernels on one thread, or on three (OpenMP: more than this machine's cores)."""
    if B._STREAM is None:
        pytest.skip("streaming kernels not built here (no C compiler at install), no AVX-512, or DEINSUM_GEMM=numpy")
    B.set_stream_threads(request.param)
    yield request.param
    B.set_stream_threads(1)


def test_streaming_kernels_equal_numpy_and_take_only_what_they_can_read(monkeypatch, stream_threads):
    """deinsum's streaming GEMMs (float64, AVX-512): rows (X @ W, W at most 32 columns) and cols (A @ X, X
    blocks at most 32 x 32) equal ``@`` for every tail of their register tiles, strided rows and
    batches; other layouts, wider sides and other dtypes go to BLAS."""
    if B._STREAM is None:
        pytest.skip("streaming kernels not built here (no C compiler at install), no AVX-512, or DEINSUM_GEMM=numpy")
    calls = []
    monkeypatch.setattr(B, "_STREAM", tuple((lambda f, kind: lambda *args: calls.append(kind) or f(*args))(f, kind)
                                            for f, kind in zip(B._STREAM, KINDS)) + B._STREAM[4:])
    monkeypatch.setattr(B, "_STREAM_WORK", 0)
    rng = np.random.default_rng(0)
    mats = lambda *shape: rng.standard_normal(shape)
    cases = [(mats(*b, m, k), mats(k, n), "rows") for b, m, k, n in itertools.product(
        [(), (3,)], [1, 7, 8, 9, 13], [1, 5, 600], [1, 7, 8, 9, 24, 25, 32])]
    cases += [(mats(m, k), mats(*b, k, n), "cols") for b, m, k, n in itertools.product(
        [(), (2,)], [1, 7, 8, 9, 24, 32], [1, 30], [1, 7, 8, 17, 24, 31])]
    wide = mats(2, 9, 40)
    cases += [(wide[:, :, 3:33], mats(30, 5), "rows"), (wide[:, ::2, :30], mats(30, 5), "rows"),
              (mats(4, 5), wide[:, :5, 2:30], "cols"), (wide.transpose(0, 2, 1)[:, 3:], mats(9, 3), None),
              (mats(50, 30), mats(30, 40)[:, 3:10], "rows"), (mats(50, 30), mats(5, 30).T, "rows")]
    cases += [(mats(50, 30), mats(30, 33), None), (mats(30, 50).T, mats(30, 4), None), (mats(2, 5, 6), mats(2, 6, 3), None),
              (mats(40, 6), mats(6, 40), None), (mats(50, 30).astype(np.float32), mats(30, 4).astype(np.float32), None)]
    for a, b, kind in cases:
        if kind and a.ndim == b.ndim == 2:     # two matrices: the larger one streams
            kind = "rows" if a.shape[0] >= b.shape[1] else "cols"
        before = len(calls)
        res = B.matmul(a, b)
        assert res.shape == (a @ b).shape and res.dtype == (a @ b).dtype
        np.testing.assert_allclose(res, a @ b, rtol=1e-5, atol=1e-9)
        assert calls[before:] == ([kind] if kind else []), (a.shape, a.strides, b.shape, b.strides, kind)


def test_rows_sum_kernel_equals_numpy(stream_threads):
    """``stream_rows_sum`` (out[f] += sum over g of H[g] * (X[f] @ W)[g]: MTTKRP to leading free modes) equals
    numpy for every tail of its register tiles (N = 1..32, G not a multiple of the tile's rows), rows of X,
    W, H and out apart by more than their length, and fewer batches than threads (rows split among them)."""
    rng = np.random.default_rng(2)
    for nf, g, k, n in itertools.product([1, 3], [1, 5, 8, 13], [1, 70], [1, 7, 8, 9, 24, 25, 32]):
        x = rng.standard_normal((nf, g, k + 2))[:, :, 1:k + 1]
        w, h, out = rng.standard_normal((k, n + 3)), rng.standard_normal((g, n + 1)), np.ones((nf, n + 4))
        B.run_stream("rows sum", nf, n, nf, g, n, k, x.ctypes.data, k + 2, g * (k + 2), w.ctypes.data, n + 3,
                     h.ctypes.data, n + 1, out.ctypes.data, n + 4)
        np.testing.assert_allclose(out[:, :n], 1 + np.einsum("fgk,kn,gn->fn", x, w[:, :n], h[:, :n]), rtol=1e-10,
                                   atol=1e-10 * k * g)
        assert (out[:, n:] == 1).all(), (nf, g, k, n)


def test_streamed_ttm_chains_equal_numpy(monkeypatch, stream_threads):
    """Random TTM chains (orders 3 to 5, sides 1..40 against new sides 1..33, factors in either orientation,
    any output order, X's first axis kept or contracted) on ``ttm_chain``: every register-tile tail of
    its mode products (columns and rows) and every order; a new side over 32 and a strided X (run step by
    step instead) too."""
    if B._STREAM is None:
        pytest.skip("streaming kernels not built here (no C compiler at install), no AVX-512, or DEINSUM_GEMM=numpy")
    calls = []
    chain = B._STREAM[2]
    monkeypatch.setattr(B, "_STREAM", B._STREAM[:2] + ((lambda *args: calls.append(args[1]) or chain(*args)),)
                        + B._STREAM[3:])
    monkeypatch.setattr(B, "_STREAM_WORK", 0)
    K._strategy.cache_clear()
    rng, count = np.random.default_rng(1), 0
    try:
        for case in range(150):
            order = int(rng.integers(3, 6))
            modes = "ijklm"[:order]
            sizes = {c: int(rng.choice([1, 2, 7, 8, 9, 17, 24, 25, 40])) for c in modes}
            contracted = [c for c in modes if rng.random() < 0.6] or [modes[-1]]
            news = dict(zip(contracted, "bcdef"))
            sizes.update({w: int(rng.choice([1, 3, 8, 9, 16, 24, 31, 32, 33])) for w in news.values()})
            if np.prod([max(sizes[c], sizes.get(news.get(c), 0)) for c in modes]) > 300_000:
                continue                                # (every intermediate within _SLAB: streamed)
            factors = [c + news[c] if rng.random() < 0.5 else news[c] + c for c in contracted]
            out = "".join(rng.permutation([c for c in modes if c not in news] + list(news.values())))
            eq = modes + "," + ",".join(factors) + "->" + out
            subs = [modes] + factors
            ops = operands(eq, sizes, np.float64, seed=case)
            if case % 10 == 0:                          # a strided X: step by step on BLAS
                ops[0] = operands(eq, {c: 2 * n for c, n in sizes.items()}, np.float64, case)[0][
                    tuple(slice(None, n) for n in ops[0].shape)]
            name, before = group_strategy(subs, out, [o.shape for o in ops]), len(calls)
            res, ref = contract_group(subs, out, *ops), np.einsum(eq, *ops, optimize=True)
            assert res.shape == ref.shape and res.dtype == ref.dtype
            np.testing.assert_allclose(res, ref, rtol=1e-10, atol=1e-10 * max(1.0, float(np.abs(ref).max(initial=0))))
            streamed = "one streamed pass" in name
            assert not streamed or max(sizes[w] for w in news.values()) <= 32, (eq, sizes, name)
            assert len(calls) - before == (streamed and case % 10 != 0), (eq, sizes, name)
            assert name.endswith(f", {modes[0]} by {modes[0]}") == (streamed and modes[0] not in news and sizes[modes[0]] > 1)
            count += streamed
        assert count >= 60
        # a mode product over 2..7 trailing elements in every order: step by step (BLAS was faster)
        assert group_strategy(["ijk", "jb"], "ibk", [(2000, 600, 3), (600, 24)]) == "TTM chain: j (middle); streamed GEMMs: j"
    finally:
        K._strategy.cache_clear()


def test_streaming_kernels_refuse_what_they_cannot_compute(monkeypatch):
    """No empty GEMM reaches them, they refuse a result wider than 32 columns (rows, rows sum) or empty (status 2,
    nothing written), and a build of another interface (one an editable install left behind) is not used."""
    if B._STREAM is None:
        pytest.skip("streaming kernels not built here (no C compiler at install), no AVX-512, or DEINSUM_GEMM=numpy")
    monkeypatch.setattr(B, "_STREAM_WORK", 0)
    assert [B.stream_kind(*shape, False, False) for shape in [(1, 5, 3, 0), (1, 0, 3, 4), (0, 5, 3, 4)]] == [None] * 3
    t, x, w = np.full(8, 7.0), np.ones((4, 3)), np.ones((3, 40))
    assert B._STREAM[0](1, 4, 0, 3, x.ctypes.data, 3, 0, w.ctypes.data, 40, t.ctypes.data, 0, 0, None) == 2
    assert B._STREAM[0](1, 1, 33, 3, x.ctypes.data, 3, 0, w.ctypes.data, 40, t.ctypes.data, 33, 0, None) == 2
    assert B._STREAM[1](1, 0, 4, 3, w.ctypes.data, x.ctypes.data, 3, 0, t.ctypes.data, 4, 0, None) == 2
    assert B._STREAM[3](1, 1, 33, 3, x.ctypes.data, 3, 0, w.ctypes.data, 40, w.ctypes.data, 40, t.ctypes.data, 33) == 2
    dims, mats = np.array([1, 3, 4, 2, 1, 6, 1, 2], dtype=np.int64), np.array([w.ctypes.data] * 2, dtype=np.uintp)
    assert B._STREAM[2](1, 2, dims.ctypes.data, mats.ctypes.data, x.ctypes.data, 12, t.ctypes.data, 4) == 2   # 8 != 6
    dims[5] = 0
    assert B._STREAM[2](1, 2, dims.ctypes.data, mats.ctypes.data, x.ctypes.data, 12, t.ctypes.data, 4) == 2   # empty
    assert (t == 7.0).all()
    with pytest.raises(ValueError, match="refused a product whose result is 1 x 33"):
        B.run_stream("rows", 1, 33, 1, 1, 33, 3, x.ctypes.data, 3, 0, w.ctypes.data, 40, t.ctypes.data, 33, 0, None)
    monkeypatch.setattr(L, "_STREAM_ABI", L._STREAM_ABI + 1)
    assert L._stream_kernels() is None


def test_the_streaming_kernels_run_on_the_pinned_blas_threads():
    """The runtime's BLAS pin sets the streaming kernels' threads to the same count (a process of its own:
    the pin is process-wide); OpenMP then splits batches, rows, column tiles or slabs (tested above)."""
    code = ("from deinsum.runtime.runner import pin_blas_threads; from deinsum.runtime import blas as B; "
            "print(pin_blas_threads(1), B._STREAM_THREADS)")
    res = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, OPENBLAS_NUM_THREADS="2"),
                         capture_output=True, text=True, timeout=120)
    pinned, threads = res.stdout.split()
    assert pinned == threads == str(min(2, os.cpu_count() or 1)), res.stdout


def test_mkl_runs_float_gemms_when_installed():
    """With the `fast` extra's mkl wheel, MKL runs float32/64 GEMMs and threadpoolctl limits its threads."""
    if not glob.glob(os.path.join(sys.prefix, "lib", "libmkl_rt.so*")) or os.environ.get("DEINSUM_GEMM") == "numpy":
        pytest.skip("MKL not installed here (the mkl wheel of the `fast` extra), or DEINSUM_GEMM=numpy")
    from threadpoolctl import threadpool_info, threadpool_limits
    assert set(L._GEMM) == {np.dtype(np.float32), np.dtype(np.float64)}
    with threadpool_limits(1, user_api="blas"):
        assert {p["internal_api"]: p["num_threads"] for p in threadpool_info()}.get("mkl") == 1


def test_the_l2_rule_counts_bytes_not_words():
    """MKL's batched KR^T X over middle modes runs fast while a slab of X fits in L2, in bytes: a float32
    slab of 96 x 96 x 32 elements fits where its float64 twin does not (on X 12 x 96 x 96 x 32, R = 16: 1.2 ms
    instead of 3.1). The kernel no longer takes that run there: its Khatri-Rao product is more scratch than
    the least run's (``mttkrp_scratch``)."""
    dims, axes, variant = (12, 96, 96, 32), [0, 1, 2], (1, 3, "cols", 16, True)   # GEMM over (j,k) on MKL
    small = (12, 24, 24, 32)                                                     # a slab in L2 either way
    assert M._seconds(dims, axes, 16, variant, 4, False) < M._seconds(dims, axes, 16, variant, 8, False)
    assert M._seconds(small, axes, 16, variant, 4, False) == M._seconds(small, axes, 16, variant, 8, False)
    # float64 on the streaming kernels: their fused pass (3.5 ms here; GEMM over (i,j) on BLAS: 9.8)
    if B._STREAM:
        subs, shapes = ("ijkl", "ia", "ja", "ka"), [dims, (12, 16), (96, 16), (96, 16)]
        assert group_strategy(subs, "la", shapes, np.float64) == (
            "MTTKRP to (l): GEMM over (k) KR^T X and Hadamard-sum over (i,j) in one streamed pass")


def test_leading_free_modes_and_wide_ranks_take_a_fused_pass():
    """float64 on the streaming kernels, narrow GEMMs on numpy's BLAS (as measured routes put them on this AMD
    machine): MTTKRP to a leading free mode sums each register tile's rows as it ends (order 5, 24^5, R = 24:
    7.3 ms CPU time; the GEMM, then the Hadamard-sum: 8.4), and a rank over 32 runs the fused passes in even
    blocks (16^5, R = 48, mode 3: 3.5 ms; before, the GEMM and Hadamard-sum apart in the blocks of 7 the
    temporaries allowed: 6.1)."""
    if not B._STREAM:
        pytest.skip("streaming kernels not built here (no C compiler at install), no AVX-512, or DEINSUM_GEMM=numpy")
    name = lambda subs, out, shapes: K._strategy(subs, out, shapes, False, 8, True)[1]
    assert name(("ijklm", "ja", "ka", "la", "ma"), "ia", ((24,) * 5,) + ((24, 24),) * 4) == (
        "MTTKRP to (i): GEMM over (l,m) X^T KR and Hadamard-sum over (j,k) in one streamed pass")
    assert name(("ijklm", "ia", "ja", "ka", "ma"), "la", ((16,) * 5,) + ((16, 48),) * 4).endswith(
        "in one streamed pass, rank columns in blocks of 24")


def test_deinsum_gemm_forces_the_routes():
    """DEINSUM_GEMM=numpy keeps MKL out (not even loaded) and the model's picks follow; mkl and stream force
    their routes (where installed), nothing measured; any other value fails at import with one line."""
    code = ("from deinsum.runtime import blas as B, kernels as K, libraries as L; r = B.gemm_routes(); "
            "name = K.group_strategy(('ijk', 'ja', 'ka'), 'ia', [(64,) * 3, (64, 8), (64, 8)]); "
            "print(L._GEMM == {}, '(MKL)' in name, r['why'], r['rates'], "
            "r['routes'] == B.forced_routes(L.gemm_choice()))")
    run = lambda value: subprocess.run([sys.executable, "-c", code], env=dict(os.environ, DEINSUM_GEMM=value),
                                       capture_output=True, text=True, timeout=120)
    assert run("numpy").stdout.split() == ["True", "False", "DEINSUM_GEMM=numpy", "None", "True"]
    for value in ("mkl", "stream"):
        assert run(value).stdout.split()[2:] == [f"DEINSUM_GEMM={value}", "None", "True"]
    bad = run("openblas")
    assert bad.returncode != 0
    assert bad.stderr.strip().splitlines()[-1] == ("ValueError: DEINSUM_GEMM='openblas': expected one of auto, numpy, "
                                                   "mkl, stream")


@pytest.fixture
def routes():
    """Restores the routes tests/conftest.py pins after a test that sets its own."""
    saved = B.gemm_routes()
    yield B.use_gemm_routes
    B.use_gemm_routes(saved)


@pytest.mark.parametrize("library", ["numpy", "mkl", "stream"])
def test_each_forced_route_runs_its_library_and_equals_numpy(library, routes, monkeypatch):
    """Every class on ``library`` (as DEINSUM_GEMM forces it): a matrix product, MTTKRP and a TTM chain equal
    numpy's einsum, and the library's own GEMMs ran (MKL or the streaming kernels: counted), the other's not."""
    if library == "mkl" and not L._GEMM or library == "stream" and L._STREAM_BUILT is None:
        pytest.skip(f"{library} not installed or built here, or DEINSUM_GEMM=numpy")
    calls = []
    if L._GEMM:
        monkeypatch.setattr(L, "_GEMM", {d: (lambda g: lambda *a: calls.append("mkl") or g(*a))(g)
                                         for d, g in L._GEMM.items()})
    if L._STREAM_BUILT is not None:
        monkeypatch.setattr(L, "_STREAM_BUILT", tuple((lambda f: lambda *a: calls.append("stream") or f(*a))(f)
                                                      for f in L._STREAM_BUILT[:4]) + L._STREAM_BUILT[4:])
    monkeypatch.setattr(B, "_STREAM_WORK", 0)      # (the streaming kernels take these small shapes too)
    routes({"why": f"DEINSUM_GEMM={library}", "routes": B.forced_routes(library), "rates": None})
    for eq, sizes in [("ij,jk->ik", dict(i=70, j=50, k=60)), MTTKRP["O3-M1"], MTTKRP["O5-M4"], TTMC]:
        subs, out = split(eq)
        ops = operands(eq, sizes, np.float64)
        check(eq, ops, contract_group(subs, out, *ops))
    assert set(calls) == ({library} if library != "numpy" else set())


def test_a_cached_calibration_counts_only_on_its_own_machine(routes, monkeypatch, tmp_path):
    """Measured once, then read from the cache; an entry from another CPU model, library version or thread
    count is ignored (measured again), a damaged or unwritable cache never breaks routing. Rates are fixed here, not timed."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("DEINSUM_GEMM", "auto")
    rates = {"square": {"numpy": [45, 50], "mkl": [18, 20]}, "narrow": {"numpy": [28, 30], "mkl": [38, 40]},
             "ttm": {"numpy": [9, 10], "mkl": [4, 5]}}
    measured = []
    monkeypatch.setattr(G, "measured", lambda *libraries: measured.append(1) or rates)

    def resolved():
        routes(None)
        return B.gemm_routes()

    assert resolved()["routes"] == {"square": "numpy", "narrow": "mkl", "ttm": "numpy", "streamed": "mkl"}
    assert resolved()["rates"] == rates and len(measured) == 1                     # from the cache
    path = tmp_path / "deinsum" / "gemm-routes.json"
    entries = json.loads(path.read_text())
    other = {**rates, "square": {"numpy": [1, 1], "mkl": [99, 99]}}
    for change in ({"cpu": {**entries[0]["machine"]["cpu"], "model name": "another CPU"}},
                   {"libraries": {**entries[0]["machine"]["libraries"], "mkl": "another MKL"}},
                   {"numpy": "0.0"}, {"threads": 64}):
        path.write_text(json.dumps([{"machine": {**entries[0]["machine"], **change}, "rates": other}]))
        before = len(measured)
        assert resolved()["routes"]["square"] == "numpy" and len(measured) == before + 1, change
    path.write_text(json.dumps([{"machine": entries[0]["machine"], "rates": other}]))   # this machine's: used
    assert resolved()["routes"]["square"] == "mkl"
    path.write_text("{not json")
    assert resolved()["rates"] == rates
    monkeypatch.setenv("XDG_CACHE_HOME", str(path))                   # a file where the folder would be
    assert resolved()["rates"] == rates
    monkeypatch.setattr(G, "measured", lambda *libraries: 1 / 0)   # a failed measurement: routed as without `fast`
    assert resolved() == {"why": "not measured (ZeroDivisionError: division by zero): as without `fast`",
                          "routes": B.forced_routes("stream"), "rates": None}


# ---- shapes and memory orders ------------------------------------------------------------------------
@pytest.mark.parametrize("eq", [MTTKRP["O3-M1"][0], MTTKRP["O5-M2"][0], TTMC[0], "ij,jk->ik", "bij,bjk->bik"])
@pytest.mark.parametrize("edge", ["ones", "zero", "zero-summed"])
def test_size_one_and_size_zero_dims(eq, edge):
    subs, out = split(eq)
    letters = sorted(set(eq) - set(",->"))
    sizes = {c: 3 + n % 3 for n, c in enumerate(letters)}
    if edge == "ones":
        sizes.update({c: 1 for c in letters[::2]})
    else:
        summed = [c for c in letters if c not in out]
        sizes[summed[0] if edge == "zero-summed" else out[0]] = 0
    ops = operands(eq, sizes, np.float64)
    check(eq, ops, contract_group(subs, out, *ops))


@pytest.mark.parametrize("eq", [MTTKRP["O3-M0"][0], MTTKRP["O5-M4"][0], TTMC[0], "ij,jk,kl->il"])
@pytest.mark.parametrize("dtype", [np.float32, np.complex128, np.int64])
def test_non_contiguous_inputs(eq, dtype):
    subs, out = split(eq)
    sizes = {c: 3 + n % 3 for n, c in enumerate(sorted(set(eq) - set(",->")))}
    big = operands(eq, {c: 2 * n for c, n in sizes.items()}, dtype)
    views = [b[tuple(slice(None, None, 2) for _ in b.shape)] for b in big]          # strided slices
    check(eq, views, contract_group(subs, out, *views))
    fortran = [np.asfortranarray(v) for v in views]                                   # permuted C order
    check(eq, fortran, contract_group(subs, out, *fortran))
    flipped = [v[..., ::-1] for v in views]                                           # negative strides
    check(eq, flipped, contract_group(subs, out, *flipped))


def test_mixed_dtypes_promote():
    eq = MTTKRP["O3-M2"][0]
    subs, out = split(eq)
    ops = operands(eq, MTTKRP["O3-M2"][1], np.float32)
    ops[1] = ops[1].astype(np.complex128)
    check(eq, ops, contract_group(subs, out, *ops))


# ---- random einsums -------------------------------------------------------------------------------------
@st.composite
def einsums(draw):
    pool = "abcdefg"[: draw(st.integers(2, 7))]
    sizes = {c: draw(st.integers(0 if draw(st.booleans()) and c == "a" else 1, 4)) for c in pool}
    nops = draw(st.integers(1, 4))
    terms = ["".join(draw(st.lists(st.sampled_from(pool), min_size=0, max_size=4))) for _ in range(nops)]
    used = sorted(set("".join(terms)))
    out = "".join(draw(st.permutations([c for c in used if draw(st.booleans())])))
    return ",".join(terms) + "->" + out, sizes


@st.composite
def structured(draw):
    """MTTKRP and TTM chains of random order, mode, orientation, sizes and output order."""
    order = draw(st.integers(3, 5))
    modes = "ijklm"[:order]
    sizes = {c: draw(st.integers(1, 5)) for c in modes + "rbcdefg"}
    if draw(st.booleans()):
        free = [c for c in modes if draw(st.booleans())][: order - 2] or [modes[0]]
        factors = [c + "r" if draw(st.booleans()) else "r" + c for c in modes if c not in free]
        out = "".join(draw(st.permutations(free + ["r"])))
        if draw(st.booleans()):                                  # X already holds r
            at = draw(st.integers(0, order))
            modes = modes[:at] + "r" + modes[at:]
    else:
        kept = [c for c in modes if draw(st.booleans())][: order - 2]
        news = iter("bcdefg")
        factors, out = [], list(kept)
        for c in modes:
            if c not in kept:
                w = next(news)
                factors.append(c + w if draw(st.booleans()) else w + c)
                out.append(w)
        out = "".join(draw(st.permutations(out)))
    return modes + "," + ",".join(draw(st.permutations(factors))) + "->" + out, sizes


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(einsums(), structured()), st.sampled_from(DTYPES))
def test_random_einsums_equal_numpy(case, dtype):
    eq, sizes = case
    subs, out = split(eq)
    ops = operands(eq, sizes, dtype)
    check(eq, ops, contract_group(subs, out, *ops))


# ---- strategy choice and memory ---------------------------------------------------------------------------
def test_strategy_names_suite():
    shapes = lambda eq, sz: [[sz[c] for c in t] for t in split(eq)[0]]
    eq, sz = MTTKRP["O5-M2"]
    assert group_strategy(split(eq)[0], "ka", shapes(eq, sz)).startswith("MTTKRP to (k): GEMM over (")
    assert group_strategy(*split(TTMC[0]), shapes(*TTMC)).startswith("TTM chain: ")
    assert group_strategy(("ij", "jk", "kl"), "il", [(2, 3), (3, 4), (4, 5)]) == "pairwise: ij,jk,kl->il"
    assert group_strategy(("ij", "jk"), "ik", [(2, 0), (0, 4)]) == "zeros (an empty block)"


def peak_ratio(eq, sizes, seed=0):
    """Peak traced bytes during contract_group over (inputs + output) bytes."""
    subs, out = split(eq)
    ops = operands(eq, sizes, np.float64, seed)
    contract_group(subs, out, *ops)                # strategy cached, BLAS warm
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        res = contract_group(subs, out, *ops)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    data = sum(o.nbytes for o in ops) + res.nbytes
    return (peak + sum(o.nbytes for o in ops)) / data, res


@pytest.mark.parametrize("eq,sizes", [
    (MTTKRP["O3-M1"][0], dict(i=64, j=48, k=80, a=16)),
    ("ijklm,ia,ja,la,ma->ka", dict(i=12, j=10, k=14, l=10, m=12, a=12)),
    ("ijk,ja,ka->ia", dict(i=64, j=64, k=64, a=400)),              # large rank: blocked rank columns
    (TTMC[0], dict(i=16, j=14, k=16, l=12, m=14, b=4, c=5, d=4, e=3)),
    (TTMC[0], dict(i=8, j=24, k=24, l=24, m=24, b=8, c=8, d=8, e=8)),   # run in slabs of i
])
def test_peak_memory_within_1_5x_of_inputs_and_output(eq, sizes):
    subs, out = split(eq)
    ratio, _ = peak_ratio(eq, sizes)
    assert ratio <= 1.5, (group_strategy(subs, out, [[sizes[c] for c in t] for t in subs]), ratio)


def test_large_ttm_chain_runs_in_slabs():
    """On BLAS (float32 here) slab by slab; float64 in one streamed pass, i by i, where the kernels are built."""
    eq, sizes = TTMC[0], dict(i=8, j=24, k=24, l=24, m=24, b=8, c=8, d=8, e=8)
    subs, out = split(eq)
    shapes = [[sizes[c] for c in t] for t in subs]
    assert group_strategy(subs, out, shapes, np.float32).split("; ")[1:] == [
        "in slabs of 3 i", "narrow GEMMs in pieces of <= 1e6 multiply-adds (float)"]
    assert group_strategy(subs, out, shapes) == ("TTM chain: j, k, l, m in one streamed pass, i by i" if B._STREAM
                                                 else group_strategy(subs, out, shapes, np.float32))
    # the order does not follow the operands' (m, l, k, j first: 25% slower here)
    assert group_strategy(subs[:1] + subs[:0:-1], out, shapes[:1] + shapes[:0:-1]) == group_strategy(subs, out, shapes)


def test_large_rank_is_blocked():
    eq, sizes = "ijk,ja,ka->ia", dict(i=64, j=64, k=64, a=400)
    subs, out = split(eq)
    assert "rank columns in blocks of" in group_strategy(subs, out, [[sizes[c] for c in t] for t in subs])


@pytest.mark.parametrize("dtype", DTYPES)
def test_transposed_copies(dtype):
    (a,) = operands("abcd->abcd", dict(a=9, b=10, c=11, d=70), dtype)
    for perm in [(3, 1, 2, 0), (0, 1, 3, 2), (1, 0, 2, 3), (0, 1, 2, 3)]:
        t = L.transposed(a, perm)
        assert t.flags.c_contiguous
        np.testing.assert_array_equal(t, a.transpose(perm))


def test_every_rank_routes_as_rank_0_does(tmp_path):
    """Ranks whose caches disagree (rank 0 measured numpy's BLAS faster, rank 1 MKL) route alike once a
    program runs on them: rank 0's routes, broadcast where the runtime is made."""
    from mpirun import check_mpi
    out = check_mpi(2, f"""
        import json, os
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        os.environ.update(XDG_CACHE_HOME=os.path.join({str(tmp_path)!r}, str(comm.rank)), DEINSUM_GEMM="auto")
        import numpy as np
        import deinsum
        from deinsum.runtime import blas as B
        from deinsum.runtime.gemm import machine_key, store_rates
        fast = [{{"numpy": [50, 50], "mkl": [10, 10]}}, {{"numpy": [10, 10], "mkl": [50, 50]}}][comm.rank]
        store_rates(machine_key(B.gemm_libraries()), {{"square": fast, "narrow": fast, "ttm": fast}})
        mine = B.gemm_routes()["routes"]
        a, b = np.ones((40, 30)), np.ones((30, 20))
        assert np.allclose(deinsum.compile("ij,jk->ik", a.shape, b.shape)(a, b), a @ b)
        rows = comm.gather([comm.rank, mine["square"], B.gemm_routes()["routes"]["square"]])
        if comm.rank == 0:
            print(json.dumps(rows))
        """, tmp_path=tmp_path)
    assert json.loads(out) == [[0, "numpy", "numpy"], [1, "mkl", "numpy"]]


@pytest.mark.parametrize("eq,sizes,cut", [
    ("ijk,ja,ka->ia", dict(i=40, j=60, k=50, a=24), (0, 1)),       # a round over j, pieces of i
    ("ijk,ia,ka->ja", dict(i=60, j=40, k=50, a=24), (2, 1)),       # a round over k, pieces of j
    ("ijklm,ja,ka,la,ma->ia", dict(i=12, j=14, k=10, l=12, m=14, a=24), (0, 3)),
    ("ijklm,ia,ja,la,ma->ka", dict(i=12, j=14, k=10, l=12, m=14, a=24), (2, 4)),
])
def test_mttkrp_scratch_within_its_footprint_terms(eq, sizes, cut):
    """On a part of X cut along ``cut`` (as a group's round and piece cut it), the runtime runs a variant whose
    view of X needs no copy where one exists, on a run of least scratch, and every variant it may run makes at
    most what ``mttkrp_scratch`` counts (a copy of X where none exists)."""
    from deinsum.peak import SLACK, mttkrp_form, mttkrp_scratch
    subs, out = split(eq)
    ops = operands(eq, {c: 2 * n if q in cut else n for q, (c, n) in enumerate(sizes.items())}, np.float64)
    ops[0] = ops[0][tuple(slice(None, sizes[c]) for c in subs[0])]      # a part: X's axes in cut do not merge
    ops[1:] = [f[:sizes[f_sub[0]]] for f, f_sub in zip(ops[1:], subs[1:])]
    x, r, axes = mttkrp_form(subs, out)
    bounds = K._bounds(ops[x])
    assert bounds == tuple(sorted(q for q in cut if q)), bounds
    size = lambda sub: int(np.prod([sizes[c] for c in sub]))  # noqa: E731
    terms, made = mttkrp_scratch(subs[x], r, axes, out, size, bounds)
    counted = sum(n * size(sub) for sub, n in terms)
    allowed = 8 * (counted + size(out))
    params = K._strategy(tuple(subs), out, tuple(o.shape for o in ops), False, 8, False, None,
                         tuple(map(K._bounds, ops)))[2]
    runs = [run for run, (on_blas, _) in made.items() if on_blas <= counted]      # the kernel's (no fused pass)
    assert params[2][:2] in runs and set(made) <= set(mttkrp_runs(len(subs[x]), axes, bounds)), params
    for s, e, orient in M._variants(runs):
        tracemalloc.start()
        try:
            got = M.run(subs, out, ops, np.dtype(np.float64), (x, r, (s, e, orient, sizes[r], False)))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        check(eq, ops, got)
        assert peak <= allowed + SLACK, (s, e, orient, peak, allowed)


@pytest.mark.parametrize("eq,sizes", [
    ("ijklm,ia,ja,ka,ma->la", dict(i=16, j=16, k=16, l=16, m=16, a=24)),      # rows: the modes before lead X
    ("ijklm,ja,ka,la,ma->ia", dict(i=16, j=16, k=16, l=16, m=16, a=48)),      # rows sum, columns in blocks
    ("ijk,ia,ja->ka", dict(i=256, j=64, k=96, a=24)),                         # cols
])
def test_a_fused_mttkrp_pass_within_the_least_scratch(eq, sizes):
    """Where the kernel takes a fused pass (streaming kernels built), it makes at most ``w`` times its words per
    rank column and the result (``mttkrp_scratch``), and at most the least on BLAS, which the footprint counts."""
    from deinsum.peak import SLACK, mttkrp_form, mttkrp_scratch
    if not B._STREAM:
        pytest.skip("the streaming kernels are not built here, or not routed")
    subs, out = split(eq)
    ops = operands(eq, sizes, np.float64)
    x, r, axes = mttkrp_form(subs, out)
    size = lambda sub: int(np.prod([sizes[c] for c in sub]))  # noqa: E731
    terms, made = mttkrp_scratch(subs[x], r, axes, out, size)
    kind, name, params = K._strategy(tuple(subs), out, tuple(o.shape for o in ops), False, 8, True)
    assert "in one streamed pass" in name, name
    s, e, _, block, _ = params[2]
    made_here = block * sum(n * size(sub) for sub, n in made[s, e][1]) + size(out)   # the pass' terms per column
    assert made_here <= sum(n * size(sub) for sub, n in terms)
    M.run(subs, out, ops, np.dtype(np.float64), params)                  # warm
    tracemalloc.start()
    try:
        got = M.run(subs, out, ops, np.dtype(np.float64), params)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    check(eq, ops, got)
    assert peak <= 8 * made_here + SLACK, (peak, 8 * made_here)


@pytest.mark.parametrize("eq,sizes", [
    ("ijk,ja,ka->ia", dict(i=4000, j=6, k=5, a=96)),           # T (i x k x r) larger than X: rank columns in blocks
    ("ijklm,ja,ka,la,ma->ia", dict(i=5000, j=2, k=2, l=2, m=2, a=64)),
])
def test_mttkrp_scratch_in_blocks_within_its_footprint_terms(eq, sizes):
    """Where T with every rank column would outgrow X, the kernel takes the columns in blocks, and makes at most
    what ``mttkrp_scratch`` counts with the blocks' sizes."""
    from deinsum.peak import SLACK, mttkrp_form, mttkrp_scratch
    subs, out = split(eq)
    ops = operands(eq, sizes, np.float64)
    x, r, axes = mttkrp_form(subs, out)
    size = lambda sub: int(np.prod([sizes[c] for c in sub]))  # noqa: E731
    terms, _ = mttkrp_scratch(subs[x], r, axes, out, size)
    assert (subs[x], 1) in terms                                       # the run counted in blocks
    allowed = 8 * (sum(n * size(sub) for sub, n in terms) + size(out))
    contract_group(subs, out, *ops)                                    # strategy cached
    tracemalloc.start()
    try:
        got = contract_group(subs, out, *ops)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    check(eq, ops, got)
    assert peak <= allowed + SLACK, (peak, allowed)


def test_an_outer_product_step_makes_its_result_c_ordered():
    """A step with no summed index (outer product, KRP, Hadamard) writes its result in the requested order: a move
    of it then needs no C-ordered copy, which the footprint does not hold (dbed,ec,a->bead at P = 2 once peaked
    13% over its footprint, measured with tracemalloc)."""
    rng = np.random.default_rng(0)
    a, b = rng.random((4, 5, 6)), rng.random((6, 3))
    for got in (K.contract_group(("dbe", "ea"), "bead", a, b), K.contract_pair(a, b, "dbe", "ea", "bead")):
        assert got.flags.c_contiguous
        np.testing.assert_allclose(got, np.einsum("dbe,ea->bead", a, b))
    for i in (1, 2, 64):                 # and nothing of the result's size besides it, whatever the shapes
        a, b = rng.random((i, 64)), rng.random((64, 64))
        tracemalloc.start()
        got = K.contract_pair(a, b, "ij", "kl", "ikjl")
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert got.flags.c_contiguous and peak <= got.nbytes + 2**18, (i, peak, got.nbytes)
        np.testing.assert_allclose(got, np.einsum("ij,kl->ikjl", a, b))
