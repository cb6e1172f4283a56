"""The local kernels' cost model: this machine's constants and the modeled seconds of a GEMM.

STANDALONE: the standard library only. The kernels pick among equivalent ways to compute a group by the
seconds modeled here (MTTKRP variants, TTM step orders); only the ratios of these constants steer a choice.

>>> gemm_seconds(512, 512, 512) > gemm_seconds(512, 512, 8)
True
"""

#: Cost model constants, in seconds (one core, float64; only their ratios steer the choice).
_PEAK = 5e10          # GEMM flop/s at large M, K, N
_CALL = 0.5e-6        # per GEMM call (numpy matmul loop + BLAS set-up)
_CALL_SMALL = 1e-7    # per call of OpenBLAS's small-matrix kernels (no packing)
_SMALL_RATE = 2.5e10  # their flop/s (narrow TTM steps: (8 x 24) @ (24 x n))
ELEM = 1.2e-9         # per element of an elementwise pass (Khatri-Rao, Hadamard-sum, copy)
#: MTTKRP GEMM variants by library: (the m, k and n that double the time per flop, relative speeds of
#: X^T KR over trailing, middle and leading modes, of KR^T X over trailing, middle and leading modes),
#: fitted on 26 shapes here (orders 3-5, R = 8-48, every variant on both libraries timed:
#: scripts/bench_mttkrp_variants.py). OpenBLAS packs X first and streams it fastest as KR^T @ X, X
#: untransposed; MKL streams X while it computes, fastest as X^T KR over trailing modes or KR^T X over
#: middle ones (its other speeds, 0.1, are set: never the pick).
MTTKRP_FIT = {False: (4.0, 6.0, 24.0, 0.5, 0.5, 0.5, 0.7, 1.0, 1.0),
              True: (16.0, 64.0, 8.0, 3.0, 0.1, 0.1, 0.1, 3.0, 0.1)}
#: Flop/s of the streaming kernels' fused MTTKRP passes (GEMM and Hadamard-sum), by kind, in the units of
#: the fit above: fitted on scripts/bench_mttkrp_variants.py --kernels ("rows sum": from "rows" by CPU time).
FUSED_RATE = {"rows": 6e10, "rows sum": 6.1e10, "cols": 4.5e10}
#: Bytes in one core's L1 data and L2 caches here (48 KiB, 2 MiB).
L1_BYTES = 48 << 10
L2_BYTES = 2 << 20
#: Multiply-adds per GEMM call up to which OpenBLAS (>= 0.3.16, x86-64) runs its small-matrix kernels,
#: which read both operands in place instead of packing them; and the widest narrow side that gains.
SMALL_GEMM = 1_000_000
NARROW = 16


def cut_in_pieces(m, k, n):
    """Whether ``blas.matmul`` runs an (m x k) @ (k x n) GEMM (numpy's BLAS) in pieces of at most SMALL_GEMM
    multiply-adds along its wide side: past that size, with a narrow side, where each piece keeps NARROW columns
    of the wide side at least (a long k would cut it into matrix-vector products).

    >>> cut_in_pieces(8, 24, 13824), cut_in_pieces(8, 262144, 64), cut_in_pieces(64, 24, 13824)
    (True, False, False)
    """
    narrow = min(m, n)
    return m * k * n > SMALL_GEMM and narrow <= NARROW and SMALL_GEMM // max(k * narrow, 1) >= NARROW


def gemm_seconds(m, k, n, calls=1, pieces=False, short=(4.0, 48.0, 24.0)):
    """Modeled seconds of ``calls`` numpy GEMMs (m x k) @ (k x n), C order: small sizes run below peak
    (an m, k or n of ``short`` doubles the time per flop).

    Fitted on this machine's OpenBLAS, one thread: a narrow n (BLAS's m) costs more than a narrow m;
    with ``pieces`` (TTM steps through ``blas.matmul``: a short k), small-matrix kernels (up to 1e6
    multiply-adds per call, or a narrow side cut in such pieces) run at a flat rate with little set-up.
    """
    if pieces and (m * k * n <= SMALL_GEMM or cut_in_pieces(m, k, n)):
        return calls * (-(-m * k * n // SMALL_GEMM) * _CALL_SMALL + 2.0 * m * k * n / _SMALL_RATE)
    eff = 1.0 / (1.0 + short[0] / m + short[1] / k + short[2] / n)
    return calls * (2.0 * m * k * n / (_PEAK * eff) + _CALL)

