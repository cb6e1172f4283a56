"""Every GEMM of the local kernels: the library each class of GEMM is routed to, and the call (``matmul``).

STANDALONE: numpy and the sibling runtime modules. Routes (``gemm_routes``) are measured once per machine
(``gemm.py``), forced by ``DEINSUM_GEMM`` or agreed across ranks. Where the streaming kernels are routed, a
float64 GEMM with a narrow side whose wide operand can be read in place runs on them (``_streamed``: they hide
the read of X behind the arithmetic); others run on MKL or numpy's BLAS, each class as routed.

>>> a, b = np.arange(6.).reshape(2, 3), np.arange(12.).reshape(3, 4)
>>> bool(np.allclose(matmul(a, b), a @ b))
True
"""
import math

import numpy as np

from . import libraries
from .cost import L1_BYTES, L2_BYTES, SMALL_GEMM, cut_in_pieces
from .libraries import array_module, gemm_choice

#: deinsum's streaming GEMMs where the routes run them (``libraries._STREAM_BUILT``), else None.
_STREAM = None

#: Threads the streaming kernels run on (``set_stream_threads``).
_STREAM_THREADS = 1


def set_stream_threads(threads):
    """Run the streaming kernels on ``threads`` threads (OpenMP), as many as the rank's BLAS: the runtime
    sets it where it pins BLAS threads; 1 until then. Measured GEMM routes are resolved again for the new
    thread count where next needed (forced or agreed ones stay)."""
    global _STREAM_THREADS
    _STREAM_THREADS = max(1, int(threads))
    if _STREAM is not None:
        _STREAM[4](_STREAM_THREADS)
    if _ROUTES is not None and _ROUTES["why"] == "measured":
        use_gemm_routes(None)


#: The GEMM classes routed apart, with what they cover (``gemm_library`` names each one's library).
GEMM_CLASSES = {"square": "square GEMMs (matrix products, pairwise steps)",
                "narrow": "MTTKRP GEMMs on BLAS (a wide X times <= 32 columns)",
                "ttm": "TTM steps on BLAS (a short k, <= 16 columns)",
                "streamed": "the streaming kernels' shapes (float64 MTTKRP and TTM passes)"}
_NAMES = {"numpy": "numpy's BLAS", "mkl": "Intel MKL", "stream": "deinsum's streaming kernels"}
#: This process's routes (``gemm_routes``), resolved the first time a GEMM needs one.
_ROUTES = None
#: How many times the routes were set (``use_gemm_routes``): what depends on them is cached under it.
_EPOCH = 0


def forced_routes(name):
    """The routes ``DEINSUM_GEMM=name`` forces: ``numpy`` every GEMM on numpy's BLAS (MKL and the streaming
    kernels out); ``mkl`` every GEMM on MKL (where installed); ``stream`` the streaming kernels on their
    shapes (where built), numpy's BLAS elsewhere.

    >>> forced_routes("numpy")
    {'square': 'numpy', 'narrow': 'numpy', 'ttm': 'numpy', 'streamed': 'numpy'}
    """
    mkl = "mkl" if name == "mkl" and np.dtype(np.float64) in libraries._GEMM else "numpy"
    stream = "stream" if name == "stream" and libraries._STREAM_BUILT is not None else mkl
    return {"square": mkl, "narrow": mkl, "ttm": mkl, "streamed": stream}


def _resolve():
    """``{"why", "routes", "rates"}`` for this process: forced by ``DEINSUM_GEMM``, else measured by the
    sibling module ``gemm`` (cached per machine; an emitted script carries it too). Where that fails: the
    routes of an install without `fast` (numpy's BLAS, the streaming kernels on their shapes)."""
    forced = gemm_choice()
    if forced != "auto":
        return {"why": f"DEINSUM_GEMM={forced}", "routes": forced_routes(forced), "rates": None}
    from . import gemm
    try:   # (never break a run over a measurement)
        return gemm.measured_routes(gemm_trial, ("numpy", "mkl") if np.dtype(np.float64) in libraries._GEMM else ("numpy",),
                                    ("stream",) if libraries._STREAM_BUILT is not None else (),
                                    gemm_libraries())
    except Exception as exc:
        return {"why": f"not measured ({type(exc).__name__}: {exc}): as without `fast`",
                "routes": forced_routes("stream"), "rates": None}


def gemm_libraries():
    """The builds of the GEMM libraries besides numpy's (MKL's version, the streaming kernels'): part of the
    key under which measured routes are cached."""
    return {"mkl": libraries._MKL_VERSION, "stream": libraries._STREAM_BUILT and libraries._STREAM_BUILT[5]}


def gemm_trial(a, b, library):
    """``a @ b`` on ``library`` alone (numpy, mkl or stream), whatever the routes: what ``gemm.py`` times.

    >>> gemm_trial(np.ones((2, 3)), np.ones((3, 2)), "numpy").tolist()
    [[3.0, 3.0], [3.0, 3.0]]
    """
    global _STREAM
    routed, _STREAM = _STREAM, libraries._STREAM_BUILT if library == "stream" else None
    try:
        return matmul(a, b, library)
    finally:
        _STREAM = routed


def use_gemm_routes(state):
    """Route GEMMs as ``state`` says (``gemm_routes``'s form: another rank's, or forced by a test).

    >>> saved = gemm_routes()
    >>> use_gemm_routes({"why": "DEINSUM_GEMM=numpy", "routes": forced_routes("numpy"), "rates": None})
    >>> gemm_routes()["routes"]["square"], gemm_routes()["routes"]["streamed"]
    ('numpy', 'numpy')
    >>> use_gemm_routes(saved)    # (None: resolved again where next needed)
    """
    global _ROUTES, _STREAM, _EPOCH
    _ROUTES, _EPOCH = state, _EPOCH + 1
    _STREAM = libraries._STREAM_BUILT if state and state["routes"]["streamed"] == "stream" else None
    if _STREAM is not None:
        _STREAM[4](_STREAM_THREADS)


def gemm_routes():
    """This process's GEMM routes: ``{"why": "measured" or what forced them, "routes": {class: library},
    "rates": {class: {library: GFLOP/s}} or None}``, resolved on first use (``_resolve``)."""
    if _ROUTES is None:
        use_gemm_routes(_resolve())
    return _ROUTES


def agree_gemm_routes(comm):
    """Collective: every rank of ``comm`` routes its GEMMs as rank 0 does (``gemm_routes`` there: resolved
    where not yet), so ranks on different CPUs differ in speed, never in behaviour."""
    state = comm.bcast(gemm_routes() if comm.Get_rank() == 0 else None, root=0)
    use_gemm_routes(dict(state, why="measured on rank 0" if state["why"] == "measured" else state["why"]))


def route(cls):
    """The library GEMMs of class ``cls`` (one of :data:`GEMM_CLASSES`) run on: numpy, mkl or stream."""
    return gemm_routes()["routes"][cls]


def mkl_routed(cls, dtype):
    """Whether GEMMs of class ``cls`` and ``dtype`` run on MKL: routed there, and MKL has that dtype."""
    return route(cls) == "mkl" and np.dtype(dtype) in libraries._GEMM


def routes_epoch():
    """A number that changes whenever the routes do (resolved first): a cache key for what depends on them.

    >>> routes_epoch() == routes_epoch()
    True
    """
    gemm_routes()
    return _EPOCH



def matmul(a, b, library=None):
    """``a @ b`` (numpy's broadcasting) on CPU blocks: on the streaming kernels where routed and they take
    it; else on ``library`` (default: the route of square GEMMs): ``mkl``, MKL's strided-batch GEMM where
    installed and it reads the float operands in place; otherwise numpy, where a float GEMM with a
    narrow side (<= 16: a TTM) runs in pieces of at most 1e6 multiply-adds, cut along its wide side,
    so OpenBLAS streams the wide operand in place instead of packing it first ((8 x 24) @ (24 x 13824),
    24 times: 4.7 ms in pieces, 6.7 ms in one); not where a piece would be narrower than 16 (a long
    summed side: (8 x 262144) @ (262144 x 64) took 0.23 s in 64 pieces, 0.02 s in one).

    >>> a, b = np.ones((2, 8, 24)), np.ones((24, 9000))
    >>> bool((matmul(a, b) == 24).all()), matmul(a, b[:, :0]).shape
    (True, (2, 8, 0))
    """
    (m, k), n, dtype = a.shape[-2:], b.shape[-1], np.result_type(a.dtype, b.dtype)
    if array_module(a, b) is not np:
        return _gpu_matmul(a, b)     # (a GPU's GEMM needs no pieces)
    library = library or route("square")
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    if _STREAM is not None and dtype == np.float64 and a.dtype == b.dtype == dtype:
        res = _streamed(a, b, batch)
        if res is not None:
            return res
    if library == "mkl" and dtype in libraries._GEMM:
        a = np.broadcast_to(a.astype(dtype, copy=False), batch + (m, k))
        b = np.broadcast_to(b.astype(dtype, copy=False), batch + (k, n))
        views = [_cblas_view(v) for v in (a, b)]
        if None not in views:
            (ta, lda, sa), (tb, ldb, sb) = views
            res = np.empty(batch + (m, n), dtype)
            if res.size:   # (k = 0: beta = 0 writes zeros; C is C-ordered: ldc = n, MKL wants stridec >= m n)
                libraries._GEMM[dtype](101, ta, tb, m, n, k, 1.0, a.ctypes.data, lda, sa, b.ctypes.data, ldb, sb,
                             0.0, res.ctypes.data, n, m * n, res.size // (m * n))
            return res
    with np.errstate(all="ignore"):   # (no floating-point warnings on NaN or inf: as on MKL, whatever the route)
        if not cut_in_pieces(m, k, n) or dtype.kind != "f":
            return a @ b
        res = np.empty(batch + (m, n), dtype)
        wide = max(m, n)
        pieces = -(-wide // (SMALL_GEMM // (k * min(m, n))))
        step = -(-wide // pieces)                                       # even pieces
        for lo in range(0, wide, step):
            if m > n:
                np.matmul(a[..., lo:lo + step, :], b, out=res[..., lo:lo + step, :])
            else:
                np.matmul(a, b[..., lo:lo + step], out=res[..., lo:lo + step])
        return res


def _gpu_matmul(a, b):
    """``a @ b`` (numpy's broadcasting) of GPU arrays on cuBLAS's strided-batch GEMM (float or complex), each
    operand read in place where its matrices have a unit stride and one stride steps through its batch
    (``_cblas_view``); CuPy's matmul copies a strided view, e.g. a round's piece of X, which the footprint does
    not hold."""
    import cupy
    from cupy_backends.cuda.libs import cublas
    gemm = {"f": cublas.sgemmStridedBatched, "d": cublas.dgemmStridedBatched, "F": cublas.cgemmStridedBatched,
            "D": cublas.zgemmStridedBatched}.get(a.dtype.char)
    if gemm is None or a.dtype != b.dtype or min(a.ndim, b.ndim) < 2 or 0 in a.shape + b.shape:
        return a @ b
    (m, k), n = a.shape[-2:], b.shape[-1]
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    views = [_cblas_view(cupy.broadcast_to(x, batch + x.shape[-2:])) for x in (a, b)]
    count = math.prod(batch)
    if None in views or max(m, n, k, count, views[0][1], views[1][1]) >= 2**31:
        return a @ b
    (flag_a, lda, stride_a), (flag_b, ldb, stride_b) = views
    c = cupy.empty(batch + (m, n), a.dtype)
    one, zero = np.ones(1, a.dtype), np.zeros(1, a.dtype)
    handle = cupy.cuda.device.get_cublas_handle()
    cublas.setStream(handle, cupy.cuda.get_current_stream().ptr)
    # row-major C = A B is column-major C^T = B^T A^T: a row-major operand (CBLAS flag 111) is read as is (op N),
    # a column-major one (112) transposed (op T), each with its leading dimension and batch stride
    gemm(handle, flag_b - 111, flag_a - 111, n, m, k, one.ctypes.data, b.data.ptr, ldb, stride_b, a.data.ptr, lda,
         stride_a, zero.ctypes.data, c.data.ptr, n, m * n, count)
    return c


#: Multiply-adds from which a GEMM runs on the streaming kernels, and their narrow side's limit.
_STREAM_WORK = 1 << 22
_STREAM_NARROW = 32


def _streamed(a, b, batch):
    """``a @ b`` (float64) on deinsum's streaming kernels where one operand is wide, read in place with
    unit stride along its rows, and the other narrow and shared by the batch; else None.

    * rows: T = X @ W with W (k x n) of at most 32 columns that fits in L2: MTTKRP's X^T KR over
      trailing modes (order 3, 256^3, R = 24, mode 1: 13.1 ms; MKL 19.4, OpenBLAS 36.0);
    * cols: T = A @ X with A (m x k) and every X block at most 32 rows and columns: KR^T X over middle
      modes in small blocks (order 5, 24^5, mode 4: 7.3 ms; MKL 8.1).

    >>> x, w = np.arange(2 * 300 * 70.).reshape(2, 300, 70), np.ones((70, 3))
    >>> r = _streamed(x, w, (2,))
    >>> r is None or bool((r == x @ w).all())
    True
    """
    (m, k), n = a.shape[-2:], b.shape[-1]
    kind = stream_kind(math.prod(batch), m, k, n, a.ndim > 2, b.ndim > 2)
    if kind == "rows":
        view = _cblas_view(np.broadcast_to(a, batch + (m, k)))
        if view is not None and view[0] == 111:
            w_view = _cblas_view(b)        # W read in place where its rows are, else a contiguous copy
            w, ldw = (b, w_view[1]) if w_view is not None and w_view[0] == 111 else (np.ascontiguousarray(b), n)
            res = np.empty(batch + (m, n))
            run_stream("rows", m, n, math.prod(batch), m, n, k, a.ctypes.data, view[1], view[2], w.ctypes.data, ldw,
                       res.ctypes.data, n, m * n, None)
            return res
    if kind == "cols":
        view = _cblas_view(np.broadcast_to(b, batch + (k, n)))
        if view is not None and view[0] == 111:
            at = np.ascontiguousarray(a.T)
            res = np.empty(batch + (m, n))
            run_stream("cols", m, n, math.prod(batch), m, n, k, at.ctypes.data, b.ctypes.data, view[1], view[2],
                       res.ctypes.data, n, m * n, None)
            return res
    return None


#: The streaming kernels by name: their place in ``_STREAM``.
_KERNELS = {"rows": 0, "cols": 1, "chain": 2, "rows sum": 3}


def run_stream(kernel, m, n, *args):
    """Call the routed streaming kernel ``kernel`` (rows, cols, chain or rows sum: see ``_stream.c``) on ``args``
    for a result of m x n; raise on its error status (1: no memory for its scratch blocks; 2: a shape it
    does not take, which the routing never passes)."""
    status = _STREAM[_KERNELS[kernel]](*args)
    if status == 1:
        raise MemoryError(f"the streaming kernels found no memory for their scratch blocks (a result of {m} x {n})")
    if status:
        raise ValueError(f"the streaming kernels refused a product whose result is {m} x {n}")


def stream_kind(nbatch, m, k, n, a_batched, b_batched, wide=False):
    """``"rows"``, ``"cols"`` or None: the streaming kernel that takes a float64 GEMM of ``nbatch`` times
    (m x k) @ (k x n) (operands batched or shared), given its wide operand has unit stride along rows.
    With ``wide`` (the fused MTTKRP pass), "cols" takes any n where a column tile of X (k x 24) stays
    in L1 while the rows of A re-read it.

    >>> stream_kind(1, 65536, 256, 24, False, False) == ("rows" if route("streamed") == "stream" else None)
    True
    """
    if _STREAM is None or nbatch * m * k * n < max(1, _STREAM_WORK):    # (never an empty GEMM)
        return None
    a_wide = a_batched or (not b_batched and m >= n)     # the batched operand, or the larger one
    if a_wide and not b_batched and n <= _STREAM_NARROW and k * n * 8 <= L2_BYTES // 2:
        return "rows"
    if (not a_wide and not a_batched and m <= _STREAM_NARROW
            and (n <= _STREAM_NARROW or wide and k * 24 * 8 <= L1_BYTES)):
        return "cols"
    return None


def _cblas_view(x):
    """(CBLAS transpose flag, leading dimension, batch stride), in elements, that describe ``x``
    (..., rows, cols) in place to a row-major strided-batch GEMM; None where no such triple exists.

    >>> _cblas_view(np.ones((3, 4, 5))), _cblas_view(np.ones((3, 5, 4)).transpose(0, 2, 1))
    ((111, 5, 20), (112, 4, 20))
    """
    if any(s % x.itemsize or s < 0 for s in x.strides):
        return None
    *batch, (r, sr), (c, sc) = [(n, s // x.itemsize) for n, s in zip(x.shape, x.strides)]
    if (c == 1 or sc == 1) and (r == 1 or sr >= c):
        flag, ld = 111, sr if r > 1 else c
    elif (r == 1 or sr == 1) and (c == 1 or sc >= r):
        flag, ld = 112, sc if c > 1 else r
    else:
        return None
    batch = [(n, s) for n, s in batch if n > 1]   # one stride must step through them all
    if any(s != s2 * n2 for (_, s), (n2, s2) in zip(batch, batch[1:])):
        return None
    ld = max(1, ld)
    return flag, ld, batch[-1][1] if batch else (r if flag == 111 else c) * ld


def gemm_library():
    """The library each GEMM class runs on in this process and why: the rates measured (GFLOP/s, float64,
    cached per machine), or ``DEINSUM_GEMM`` forcing it; a kernel on MKL or on the streaming kernels also
    says so in its strategy name.

    >>> rates = {"square": {"numpy": [50, 52], "mkl": [48, 50]}, "ttm": {"numpy": [9, 10], "mkl": [19, 20]},
    ...          "narrow": {"numpy": [38, 40], "mkl": [33, 35], "stream": [80, 90]}}
    >>> saved = gemm_routes()
    >>> use_gemm_routes({"why": "measured", "rates": rates,
    ...                  "routes": {"square": "numpy", "narrow": "numpy", "ttm": "mkl", "streamed": "stream"}})
    >>> print(gemm_library().split("; ")[2])
    TTM steps on BLAS (a short k, <= 16 columns): Intel MKL (GFLOP/s measured, slowest-fastest round: numpy 9-10, mkl 19-20)
    >>> use_gemm_routes(saved)
    """
    state = gemm_routes()

    def why(cls):
        if not state["rates"]:
            return state["why"]
        rates = state["rates"]["narrow" if cls == "streamed" else cls]
        return "GFLOP/s measured, slowest-fastest round: " + ", ".join(
            f"{lib} {slowest}-{fastest_round}" for lib, (slowest, fastest_round) in rates.items()
            if cls != "narrow" or lib != "stream")
    return "; ".join(f"{what}: {_NAMES[state['routes'][cls]]} ({why(cls)})" for cls, what in GEMM_CLASSES.items())

