"""Benchmark the SOAP engine on the paper's suite (shared/notes/benchmarks.md).

Targets, per kernel:
  * symbolic analysis (``analyze`` of the symbolic decomposition), cold caches: <= 2 s
  * the same, cached (closed forms in memory):                               <= 1 ms
  * one numeric bound for the paper's sizes (``numeric_bound``, slowest group): <= 20 ms

Every figure is measured here: median [min, max] over ``--repeats`` runs.

    .venv/bin/python scripts/bench_soap.py [--repeats 5] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from deinsum.decompose import decompose
from deinsum.soap import Statement, analyze, clear_caches, numeric_bound, valid_groups

#: (name, einsum, size of the rank indices (or None: all equal), size of the other indices) at P = 1.
SUITE = [
    ("1MM", "ij,jk->ik", None, 4096),
    ("2MM", "ij,jk,kl->il", None, 4096),
    ("3MM", "ij,jk,kl,lm->im", None, 4096),
    ("MTTKRP-O3-M0", "ijk,ja,ka->ia", 24, 1024),
    ("MTTKRP-O3-M1", "ijk,ia,ka->ja", 24, 1024),
    ("MTTKRP-O3-M2", "ijk,ia,ja->ka", 24, 1024),
    ("MTTKRP-O5-M0", "ijklm,ja,ka,la,ma->ia", 24, 60),
    ("MTTKRP-O5-M2", "ijklm,ia,ja,la,ma->ka", 24, 60),
    ("MTTKRP-O5-M4", "ijklm,ia,ja,ka,la->ma", 24, 60),
    ("TTMc-O5-M0", "ijklm,jb,kc,ld,me->ibcde", 24, 60),
]
RANK_INDICES = "abcde"
#: Fast memory for the numeric bounds: 2**20 words (8 MiB of float64); at 2**27 most kernels fit entirely.
S_NUMERIC = 2**20
TARGETS = {"cold": 2.0, "cached": 1e-3, "numeric": 20e-3}


def shapes(equation: str, rank: int | None, other: int) -> list[tuple[int, ...]]:
    size = lambda c: rank if rank is not None and c in RANK_INDICES else other
    return [tuple(size(c) for c in term) for term in equation.split("->")[0].split(",")]


def timed(fn, repeats: int, setup=None) -> list[float]:
    out = []
    for _ in range(repeats):
        if setup:
            setup()
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def summary(ts: list[float]) -> dict:
    return {"median": statistics.median(ts), "min": min(ts), "max": max(ts), "n": len(ts)}


def fmt(s: dict) -> str:
    unit, scale = ("ms", 1e3) if s["median"] >= 1e-3 else ("us", 1e6)
    return f"{s['median'] * scale:7.2f} [{s['min'] * scale:.2f}, {s['max'] * scale:.2f}] {unit}"


def bench(repeats: int) -> list[dict]:
    rows = []
    for name, eq, rank, other in SUITE:
        sym = decompose(eq)
        cold = summary(timed(lambda: analyze(sym), repeats, setup=clear_caches))
        cached = summary(timed(lambda: analyze(sym), 50 * repeats))
        sized = decompose(eq, *shapes(eq, rank, other))
        worst, worst_group = None, None
        for g in valid_groups(sized.steps):
            st = Statement.from_steps([sized.steps[k] for k in g])
            s = summary(timed(lambda: numeric_bound(st, sized.sizes, S_NUMERIC), 4 * repeats, setup=clear_caches))
            if worst is None or s["median"] > worst["median"]:
                worst, worst_group = s, st.equation
        a = analyze(sized, S=S_NUMERIC)
        rows.append({"kernel": name, "equation": eq, "cold": cold, "cached": cached, "numeric": worst,
                     "numeric_group": worst_group, "chosen": [list(g) for g in a.chosen], "Q": a.Q,
                     "passes": {k: (cold, cached, worst)[n]["median"] <= TARGETS[k] for n, k in enumerate(TARGETS)}})
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="cold runs per kernel (cached: 50x, numeric: 4x)")
    ap.add_argument("--json", help="also write the measurements here")
    args = ap.parse_args(argv)
    rows = bench(args.repeats)
    print(f"SOAP engine benchmark: median [min, max]; numeric bounds at S = {S_NUMERIC} words, paper sizes (P=1)")
    print(f"{'kernel':<14} {'symbolic cold':<28} {'symbolic cached':<28} {'numeric (slowest group)':<28} "
          f"{'Q at S (words)':>14}  pass")
    for r in rows:
        ok = " ".join(k for k, v in r["passes"].items() if v) or "-"
        print(f"{r['kernel']:<14} {fmt(r['cold']):<28} {fmt(r['cached']):<28} {fmt(r['numeric']):<28} "
              f"{r['Q']:>14.4g}  {ok}")
    print()
    for k, limit in TARGETS.items():
        failed = [r["kernel"] for r in rows if not r["passes"][k]]
        print(f"target {k:<8} <= {limit * 1e3:g} ms: " + ("PASS (all kernels)" if not failed else
                                                         f"FAIL for {', '.join(failed)}"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"S_numeric": S_NUMERIC, "targets_s": TARGETS, "kernels": rows}, f, indent=1)


if __name__ == "__main__":
    main()
