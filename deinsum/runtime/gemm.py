"""Which library runs each class of GEMM, measured: once per machine, cached, never assumed.

``blas.py`` owns the libraries' calls and the routes and hands this module what it times; this module (which
imports nothing of deinsum) measures them where ``DEINSUM_GEMM`` is ``auto`` (the default): ``measure_rates``
times each class's candidates on one representative shape (interleaved, a few rounds), ``fastest`` picks one, and
``cached_rates``/``store_rates`` keep the rates in ``$XDG_CACHE_HOME/deinsum`` (or ``~/.cache/deinsum``)
under a key of the CPU, numpy and its BLAS, MKL's and the streaming kernels' builds and the thread count
(``machine_key``): an entry made on another CPU or library is never used, an unreadable or unwritable
cache only means measuring again. Emitted scripts carry it too.

>>> fastest({"numpy": [48.0, 50.0], "mkl": [49.0, 60.0]}, "numpy")   # rounds overlap: not clearly faster
'numpy'
>>> fastest({"numpy": [48.0, 50.0], "mkl": [55.0, 60.0], "stream": [80.0, 90.0]}, "numpy")
'stream'
"""
import json
import os
import tempfile
import time

import numpy as np

#: How much faster than the baseline's fastest round another library's slowest round must be to take a class.
_CLEARLY = 1.02
#: The version of the cached rates' form and shapes (part of the key: older entries are ignored).
_FORMAT = 1
#: Entries kept in the cache file (one per machine key, newest last).
_CACHE_ENTRIES = 16


def fastest(rates, baseline):
    """The library of ``rates`` ({library: [slowest, fastest round] in GFLOP/s}) to run a class on:
    ``baseline`` (what an install without `fast` runs) unless another library's slowest round beats the
    baseline's fastest by more than 2%; then the fastest of those. Noise never leaves the baseline."""
    clear = [lib for lib, (slowest, _) in rates.items() if slowest > _CLEARLY * rates[baseline][1]]
    return max(clear, key=lambda lib: rates[lib][1]) if clear else baseline


def routes_of(rates):
    """Each class on the library measured clearly fastest, else on what an install without `fast` runs:
    numpy's BLAS, the streaming kernels on their shapes. "narrow" on the BLAS libraries only.

    >>> routes_of({"square": {"numpy": [50, 52], "mkl": [40, 45]}, "ttm": {"numpy": [9, 10], "mkl": [20, 21]},
    ...            "narrow": {"numpy": [38, 40], "mkl": [41, 44], "stream": [80, 90]}})
    {'square': 'numpy', 'narrow': 'mkl', 'ttm': 'mkl', 'streamed': 'stream'}
    """
    blas = {lib: r for lib, r in rates["narrow"].items() if lib != "stream"}
    return {"square": fastest(rates["square"], "numpy"), "narrow": fastest(blas, "numpy"),
            "ttm": fastest(rates["ttm"], "numpy"),
            "streamed": fastest(rates["narrow"], "stream" if "stream" in rates["narrow"] else "numpy")}


def measure_rates(trials, repeat=3):
    """``{class: {library: [slowest, fastest round]}}`` in GFLOP/s of ``trials`` ({class: (flops, {library:
    call})}): ``repeat`` rounds with the libraries interleaved, after one that warms them up.

    >>> slowest, fastest_round = measure_rates({"square": (2e9, {"numpy": lambda: None})})["square"]["numpy"]
    >>> 0 < slowest <= fastest_round
    True
    """
    rates = {}
    for cls, (flops, calls) in trials.items():
        seconds = {lib: [] for lib in calls}
        for _ in range(repeat + 1):
            for lib, call in calls.items():
                start = time.perf_counter()
                call()
                seconds[lib].append(time.perf_counter() - start)
        rates[cls] = {lib: [round(flops / max(t, 1e-9) / 1e9, 1) for t in (max(s[1:]), min(s[1:]))]
                      for lib, s in seconds.items()}
    return rates


def measured(gemm, blas, stream):
    """The rates of the ``blas`` libraries (and ``stream``, the streaming kernels, where built) on one float64
    shape per class, ``gemm(a, b, library)`` running each, ~0.2 s at one thread: 512^3; (8192 x 512) @
    (512 x 24), an MTTKRP GEMM which the streaming kernels also take (their rate counts for "streamed", the
    BLAS ones for "narrow" too); (131072 x 24) @ (24 x 8), a TTM step."""
    rng = np.random.default_rng(0).standard_normal
    square, x, w, t, u = rng((512, 512)), rng((8192, 512)), rng((512, 24)), rng((131072, 24)), rng((24, 8))
    trial = lambda a, b, libs: {lib: (lambda lib=lib: gemm(a, b, lib)) for lib in libs}  # noqa: E731
    return measure_rates({"square": (2 * 512 ** 3, trial(square, square, blas)),
                          "narrow": (2 * x.size * 24, trial(x, w, blas + stream)), "ttm": (2 * t.size * 8, trial(t, u, blas))})


def blas_threads():
    """The BLAS threads of this process (threadpoolctl's count; the cores without it)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:   # pragma: no cover - threadpoolctl comes with deinsum
        return os.cpu_count() or 1
    return max((p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"), default=1)


def machine_key(libraries, threads=None):
    """The cache key: the CPU (/proc/cpuinfo's vendor, model name, family, model, stepping), numpy and its
    BLAS, the other ``libraries``' versions (MKL's, the streaming kernels' build), the BLAS ``threads``
    (default: this process's) and the environment that changes OpenBLAS's or MKL's kernels.

    >>> sorted(machine_key({"mkl": None}, 1))
    ['blas', 'cpu', 'env', 'format', 'libraries', 'numpy', 'threads']
    """
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().split("\n\n")[0].splitlines()
    except OSError:   # pragma: no cover - not Linux
        lines = []
    cpu = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines)
           if k.strip() in ("vendor_id", "model name", "cpu family", "model", "stepping")}
    blas = getattr(np.__config__, "CONFIG", {}).get("Build Dependencies", {}).get("blas", {}).get("version")
    env = {k: v for k, v in os.environ.items() if k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "MKL_ENABLE_INSTRUCTIONS")}
    return {"cpu": cpu, "numpy": np.__version__, "blas": blas, "libraries": libraries,
            "threads": blas_threads() if threads is None else threads, "env": env, "format": _FORMAT}


def measured_routes(gemm, blas, stream, libraries):
    """``{"why": "measured", "routes", "rates"}``: the rates cached for this machine key, else measured now
    (and cached); the arguments are :func:`measured`'s and :func:`machine_key`'s."""
    key = machine_key(libraries)
    rates = cached_rates(key)
    if rates is None:
        rates = measured(gemm, blas, stream)
        store_rates(key, rates)
    return {"why": "measured", "routes": routes_of(rates), "rates": rates}


def routes_cache_file():
    """``$XDG_CACHE_HOME/deinsum/gemm-routes.json`` (``~/.cache`` without it)."""
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(home, "deinsum", "gemm-routes.json")


def _cache_entries():
    try:
        with open(routes_cache_file()) as f:
            entries = json.load(f)
        return [e for e in entries if isinstance(e, dict)]
    except (OSError, ValueError, TypeError):
        return []


def cached_rates(key):
    """The rates stored for exactly this ``machine_key``, or None."""
    return next((e.get("rates") for e in _cache_entries()[::-1] if e.get("machine") == key), None)


def store_rates(key, rates):
    """Keep ``rates`` under ``key`` (written atomically; silently skipped where the cache cannot be written)."""
    entries = [e for e in _cache_entries() if e.get("machine") != key][1 - _CACHE_ENTRIES:]
    path = routes_cache_file()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(path), delete=False) as f:
            json.dump(entries + [{"machine": key, "rates": rates}], f)
        os.replace(f.name, path)
    except OSError:
        pass
