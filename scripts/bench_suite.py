#!/usr/bin/env python3
"""The paper's benchmark suite in one run: model sweep, measured runs beside opt_einsum, targets, plots.

(a) Model sweep (no ranks): every kernel at the paper's weak-scaling sizes for P in
    1..4096: deinsum's grids, bytes per rank, the SOAP bound and ratio, and the
    original artifact's grid volume where benchmarks.md lists one.
(b) Measured runs: ``mpiexec -n P scripts/suite_worker.py`` for P in {1, 2, 4} with
    threads per rank = cores // P (threadpoolctl), inputs starting evenly distributed;
    median [min, max] per phase, bytes per rank, and opt_einsum in this process with
    the same total thread count. Then 1MM at N = 4096 on P = 1 and 2, and pass/fail
    of the local-kernel targets.

Writes README.md (the summary), model_sweep.{csv,json}, measured.{csv,json}, volume_vs_bound.png
and time_breakdown.png to --out (default bench-results/).

    python scripts/bench_suite.py --quick                  # < 10 minutes on 2 cores
    python scripts/bench_suite.py                          # more repeats, larger sizes, patient planner
    python scripts/bench_suite.py --kernels 1MM --procs-model 8 64 --procs-run 1 2 --speedup-n 0
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import opt_einsum
from threadpoolctl import threadpool_limits

from bench_executor import KERNELS, time_it
from suite_model import sweep
from suite_report import (measured_table, model_table, phase_median, phase_table, plot_time_breakdown,
                          plot_volume_vs_bound, render, seconds, spread)
from suite_sizes import MODEL_PROCS, measured_sizes, shapes_of

from deinsum.runtime.runner import PHASES

MPIEXEC = str(Path(sys.executable).with_name("mpiexec"))
WORKER = Path(__file__).with_name("suite_worker.py")
MTTKRP3 = ("MTTKRP-O3-M0", "MTTKRP-O3-M1", "MTTKRP-O3-M2")
#: The issue's local-kernel targets: P=1 vs opt_einsum on every kernel and on MTTKRP-3; P=2 over P=1 on 1MM.
TARGET_VS_OPT_EINSUM, TARGET_MTTKRP3, TARGET_SPEEDUP = 1.05, 0.7, 1.8
START = ("inputs start evenly block-distributed over all P ranks (no replication), the result is left evenly "
         "distributed")


def cores() -> int:
    return len(os.sched_getaffinity(0))


def threads_per_rank(nprocs: int) -> int:
    return max(1, cores() // nprocs)


def run_worker(nprocs: int, threads: int, kernels: list[dict], repeat: int, workdir: Path, timeout: float) -> dict:
    """Launch the worker on ``nprocs`` ranks x ``threads`` BLAS threads; its JSON result."""
    spec, out = workdir / f"spec-{nprocs}x{threads}.json", workdir / f"out-{nprocs}x{threads}.json"
    spec.write_text(json.dumps({"threads": threads, "repeat": repeat, "kernels": kernels}))
    limits = {name: str(threads) for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    cmd = [MPIEXEC, "-n", str(nprocs), sys.executable, "-m", "mpi4py", str(WORKER), str(spec), str(out)]
    load_before = os.getloadavg()[0]
    with subprocess.Popen(cmd, env=os.environ | limits, start_new_session=True) as proc:
        try:
            returncode = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)   # mpiexec and every rank it started
            sys.exit(f"error: mpiexec -n {nprocs} {WORKER.name} ran past {timeout:g} s")
    if returncode != 0:
        sys.exit(f"error: mpiexec -n {nprocs} {WORKER.name} failed with exit code {returncode}")
    return json.loads(out.read_text()) | {"load_before": load_before}


def launch_conditions(result: dict) -> dict:
    """A worker result without its kernels: MPI, BLAS, ranks, threads, load."""
    return {k: v for k, v in result.items() if k != "kernels"}


def opt_einsum_seconds(equation: str, sizes: dict[str, int], threads: int, repeat: int) -> tuple[float, ...]:
    """Median, min, max seconds of opt_einsum (path planned once) in this process on ``threads`` BLAS threads."""
    shapes = shapes_of(equation, sizes)
    rng = np.random.default_rng(0)
    operands = [rng.standard_normal(s) for s in shapes]
    expression = opt_einsum.contract_expression(equation, *shapes)
    with threadpool_limits(limits=threads):
        return time_it(lambda: expression(*operands), repeat)


def with_opt_einsum(result: dict, repeat: int, cache: dict) -> list[dict]:
    """The worker's runs, each with opt_einsum timed on the same total thread count."""
    runs = []
    for run in result["kernels"]:
        total = result["nprocs"] * result["threads_per_rank"]
        key = (run["name"], json.dumps(run["sizes"]), total)
        if key not in cache:
            cache[key] = opt_einsum_seconds(run["equation"], run["sizes"], total, repeat)
        runs.append(run | {"threads": result["threads_per_rank"], "opt_threads": total, "opt_einsum": cache[key]})
    return runs


def measure_suite(kernels: list[str], procs: list[int], scale: float, repeat: int, workdir: Path,
                  timeout: float) -> tuple[list[dict], list[dict]]:
    """(runs, worker metadata) of every kernel on every P in ``procs``."""
    specs = [{"name": k, "equation": KERNELS[k][0], "sizes": measured_sizes(k, scale)} for k in kernels]
    runs, meta, cache = [], [], {}
    for nprocs in procs:
        threads = threads_per_rank(nprocs)
        print(f"  mpiexec -n {nprocs}, {threads} BLAS thread(s) per rank", flush=True)
        result = run_worker(nprocs, threads, specs, repeat, workdir, timeout)
        meta.append(launch_conditions(result))
        runs += with_opt_einsum(result, repeat, cache)
    return sorted(runs, key=lambda run: (kernels.index(run["name"]), run["nprocs"])), meta


def measure_scaling(n: int, repeat: int, workdir: Path, timeout: float) -> dict:
    """1MM at N = n: P = 1 on 1 and on all cores' threads, P = 2 on 1 thread per rank, opt_einsum on 1 and all."""
    spec = [{"name": "1MM", "equation": KERNELS["1MM"][0], "sizes": dict(i=n, j=n, k=n)}]
    runs, meta, cache = [], [], {}
    for nprocs, threads in [(1, 1), (1, cores()), (2, 1)]:
        print(f"  1MM N={n}: mpiexec -n {nprocs}, {threads} BLAS thread(s) per rank", flush=True)
        result = run_worker(nprocs, threads, spec, repeat, workdir, timeout)
        meta.append(launch_conditions(result))
        runs += with_opt_einsum(result, repeat, cache)
    single, multi, two = runs
    speedups = {}
    for measure in ("wall", "in_grid"):
        base = float(np.median(two[measure]))
        speedups[measure] = {"vs deinsum P=1 x 1 thread": float(np.median(single[measure])) / base,
                             f"vs deinsum P=1 x {cores()} threads": float(np.median(multi[measure])) / base,
                             f"vs opt_einsum x {cores()} threads": multi["opt_einsum"][0] / base,
                             "vs opt_einsum x 1 thread": single["opt_einsum"][0] / base}
    return {"n": n, "runs": runs, "speedups": speedups, "workers": meta}


def scaling_table(scaling: dict, markdown: bool = False) -> str:
    cells = [[f"deinsum P={r['nprocs']} x {r['threads']} thread(s)", seconds(r["wall"]), seconds(r["in_grid"]),
              str(max(r["bytes_received"]))] for r in scaling["runs"]]
    cells += [[f"opt_einsum x {r['opt_threads']} thread(s)", spread(*r["opt_einsum"]), "-", "0"]
              for r in scaling["runs"][:2]]
    table = render(["1MM N=%d" % scaling["n"], "end-to-end s", "in-grid s", "recv bytes/rank (max)"], cells, markdown)
    rows = [[f"P=2 x 1 thread/rank {name}", f"{scaling['speedups']['wall'][name]:.3f}",
             f"{scaling['speedups']['in_grid'][name]:.3f}"] for name in scaling["speedups"]["wall"]]
    return table + "\n\n" + render(["speed-up of", "end-to-end", "in-grid"], rows, markdown)


def targets(runs: list[dict], scaling: dict | None) -> list[list[str]]:
    """[target, measured, threshold, PASS/FAIL] rows from the measurements."""
    rows = []
    for run in runs:
        if run["nprocs"] != 1:
            continue
        ratio = float(np.median(run["wall"])) / run["opt_einsum"][0]
        limits = [TARGET_VS_OPT_EINSUM] + ([TARGET_MTTKRP3] if run["name"] in MTTKRP3 else [])
        for limit in limits:
            rows.append([f"{run['name']}: P=1 ({run['threads']} threads) / opt_einsum ({run['opt_threads']} threads)",
                         f"{ratio:.3f}", f"<= {limit}", "PASS" if ratio <= limit else "FAIL"])
    if scaling:
        for measure, label in (("wall", "end-to-end"), ("in_grid", "in-grid")):
            speedup = scaling["speedups"][measure]["vs deinsum P=1 x 1 thread"]
            rows.append([f"1MM N={scaling['n']}: P=2 x 1 thread/rank over P=1 x 1 thread ({label})",
                         f"{speedup:.3f}", f">= {TARGET_SPEEDUP}", "PASS" if speedup >= TARGET_SPEEDUP else "FAIL"])
    return rows


def measured_conditions(meta: list[dict], repeat: int) -> str:
    threads = ", ".join(f"P={m['nprocs']}: {m['threads_per_rank']}" for m in meta)
    blas = ", ".join(sorted({b for m in meta for b in m["blas"]}))
    load = ", ".join(f"{m['load_before']:.1f}" for m in meta)
    return (f"Conditions: {meta[0]['mpi']}; BLAS {blas}; numpy {meta[0]['numpy']}; opt_einsum "
            f"{opt_einsum.__version__}; {cores()} cores; BLAS threads per rank (threadpoolctl) {threads}; float64; "
            f"1-minute load average before each launch {load} (it includes this run's own earlier work; other "
            f"work on the machine disturbs times). "
            f"Start: {START}. End-to-end = wall clock between barriers, including the initial distribution "
            f"and the final gather; in-grid = compute + reduce + redistribute on the slowest rank, excluding them. "
            f"Median [min, max] of {repeat} calls after one warm-up. opt_einsum: contract_expression (path planned "
            f"once) in one process on P x threads BLAS threads. Ranks beyond {cores()} cores oversubscribe "
            f"(MPICH busy-polls): wall-clock comparisons are meaningful at P <= {cores()} only.")


def model_conditions() -> str:
    return (f"Conditions (model, no ranks): float64 bytes; {START}; bytes/rank = the busiest rank's received "
            f"bytes in deinsum's plan. Best known = the construction of shared/notes/optimal-plans.md section 1. "
            f"Bound (any fusion) = the plan's class bound (opt_einsum's path fused as any candidate, even shares, "
            f"any memory; shared/notes/citable-bounds.md); bound (this fusion) = the chosen fusion's, each group one "
            f"statement. Artifact = the "
            f"original artifact's grids scored with scripts/model_volume.py's model (each group from and to even "
            f"layouts; TTMc step order assumed).")


def notes(model_rows, runs) -> list[str]:
    out = []
    below = [f"{r.kernel} P={r.nprocs}" for r in model_rows if r.ratio_to_bound is not None and r.ratio_to_bound < 1]
    if below:
        out.append(f"{len(below)} model row(s) fall below the printed lower bound ({', '.join(below)}): a defect "
                   "of the bound, report it.")
    failed = [f"{r.kernel} P={r.nprocs} ({r.failure})" for r in model_rows if r.failure]
    if failed:
        out.append("Not modeled, the planner ran past the sweep's limits: " + "; ".join(failed) + ".")
    if any(run["nprocs"] > cores() for run in runs):
        out.append(f"Runs with more ranks than the {cores()} cores are oversubscribed: their times are not "
                   f"comparable (communication volumes are).")
    return out


def write_model(rows, out: Path) -> None:
    (out / "model_sweep.json").write_text(json.dumps([r.to_dict() for r in rows], indent=1))
    with open(out / "model_sweep.csv", "w", newline="") as f:
        writer = csv.writer(f)
        fields = list(rows[0].to_dict())
        writer.writerow(fields)
        for r in rows:
            writer.writerow([" ".join(map(str, v)) if isinstance(v, list) else
                             " ".join(f"{c}={n}" for c, n in v.items()) if isinstance(v, dict) else v
                             for v in r.to_dict().values()])


def write_measured(runs: list[dict], meta: list[dict], scaling: dict | None, target_rows, out: Path) -> None:
    (out / "measured.json").write_text(json.dumps({"workers": meta, "runs": runs, "scaling": scaling,
                                                   "targets": target_rows}, indent=1))
    with open(out / "measured.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["kernel", "nprocs", "threads_per_rank", "sizes", "wall_median", "wall_min", "wall_max",
                         "in_grid_median"] + [f"{p}_median" for p in PHASES]
                        + ["bytes_received_max", "bytes_sent_max", "matches_model", "opt_einsum_median",
                           "opt_einsum_threads"])
        for run in runs + (scaling["runs"] if scaling else []):
            wall = sorted(run["wall"])
            writer.writerow([run["name"], run["nprocs"], run["threads"],
                             " ".join(f"{c}={n}" for c, n in run["sizes"].items()), float(np.median(wall)), wall[0],
                             wall[-1], float(np.median(run["in_grid"]))]
                            + [phase_median(run, (p,)) for p in PHASES]
                            + [max(run["bytes_received"]), max(run["bytes_sent"]), run["matches_model"],
                               run["opt_einsum"][0], run["opt_threads"]])


def model_section(args) -> tuple[list, list[str]]:
    """(a): the sweep, its files and plot; (rows, Markdown parts)."""
    print(f"(a) model sweep: {len(args.kernels)} kernels x P in {args.procs_model}", flush=True)
    physical_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    rows = sweep(args.kernels, args.procs_model, limit_s=args.plan_limit_s or (120 if args.quick else 1800),
                 limit_gib=physical_gib / 3, workers=min(2, cores()))
    write_model(rows, args.out)
    plot_volume_vs_bound(rows, args.out / "volume_vs_bound.png")
    print(model_conditions(), model_table(rows), sep="\n", flush=True)
    return rows, ["## (a) Model sweep at the paper's weak-scaling sizes", model_conditions(),
                  model_table(rows, markdown=True), "![volume vs bound](volume_vs_bound.png)"]


def measured_section(args, repeat: int, scale: float, workdir: Path) -> tuple[list[dict], list[dict], list[str]]:
    """(b): the suite on every P beside opt_einsum, and its plot; (runs, launches, Markdown parts)."""
    print(f"(b) measured runs: P in {args.procs_run}, {repeat} repeats, sizes x {scale}", flush=True)
    runs, meta = measure_suite(args.kernels, args.procs_run, scale, repeat, workdir, args.timeout)
    plot_time_breakdown(runs, args.out / "time_breakdown.png")
    conditions = measured_conditions(meta, repeat)
    print(conditions, measured_table(runs), phase_table(runs), sep="\n\n", flush=True)
    return runs, meta, ["## (b) Measured runs (sizes that fit this machine)", conditions,
                        measured_table(runs, markdown=True), "Per phase, slowest rank:",
                        phase_table(runs, markdown=True), "![time breakdown](time_breakdown.png)"]


def scaling_section(args, repeat: int, workdir: Path) -> tuple[dict, list[str]]:
    """1MM at N = --speedup-n on P = 1 and 2; (results, Markdown parts)."""
    scaling = measure_scaling(args.speedup_n, repeat, workdir, args.timeout)
    conditions = measured_conditions(scaling["workers"], repeat)
    print(conditions, scaling_table(scaling), sep="\n\n", flush=True)
    return scaling, [f"## 1MM at N = {args.speedup_n}: P = 2 vs P = 1", conditions,
                     scaling_table(scaling, markdown=True)]


def targets_section(target_rows: list[list[str]]) -> list[str]:
    conditions = ("Conditions: medians of the runs above; P=1 and opt_einsum on the same BLAS threads; "
                  "speed-ups on 1 BLAS thread per rank against one rank on 1 thread.")
    headers = ["target", "measured", "threshold", "result"]
    print(conditions, render(headers, target_rows), sep="\n")
    return ["## Local-kernel targets", conditions, render(headers, target_rows, markdown=True)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="5 repeats, the one-core sizes, a 120 s planner limit")
    ap.add_argument("--out", type=Path, default=Path("bench-results"), help="output folder (default bench-results)")
    ap.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=list(KERNELS), metavar="KERNEL")
    ap.add_argument("--procs-model", nargs="*", type=int, default=list(MODEL_PROCS), help="P of the model sweep")
    ap.add_argument("--procs-run", nargs="*", type=int, default=[1, 2, 4], help="P of the measured runs")
    ap.add_argument("--repeat", type=int, help="timed calls per kernel (>= 5; default 5 quick, 10 full)")
    ap.add_argument("--scale", type=float, help="measured sizes = bench_executor's one-core sizes x this "
                                                "(default 1 quick, 1.5 full)")
    ap.add_argument("--speedup-n", type=int, default=4096, help="N of the 1MM P=2 vs P=1 runs (0: skip them)")
    ap.add_argument("--plan-limit-s", type=float, help="seconds per planned (kernel, P) (default 120 quick, 1800)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per mpiexec launch (default 1800)")
    args = ap.parse_args(argv)
    repeat = args.repeat or (5 if args.quick else 10)
    scale = args.scale or (1.0 if args.quick else 1.5)
    if repeat < 5:
        ap.error("--repeat must be >= 5: medians and spreads need at least 5 samples")
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    summary = [f"# deinsum benchmark suite\n\n`python scripts/bench_suite.py {' '.join(argv or sys.argv[1:])}` "
               f"on {cores()} cores, {time.strftime('%Y-%m-%d %H:%M')}."]
    model_rows, runs, meta, scaling = [], [], [], None
    if args.procs_model:
        model_rows, parts = model_section(args)
        summary += parts
    with tempfile.TemporaryDirectory() as workdir:
        if args.procs_run:
            runs, meta, parts = measured_section(args, repeat, scale, Path(workdir))
            summary += parts
        if args.speedup_n:
            scaling, parts = scaling_section(args, repeat, Path(workdir))
            summary += parts
    target_rows = targets(runs, scaling)
    if runs or scaling:
        write_measured(runs, meta, scaling, target_rows, args.out)
    if target_rows:
        summary += targets_section(target_rows)
    remarks = notes(model_rows, runs)
    if remarks:
        summary += ["## Notes"] + [f"- {r}" for r in remarks]
    (args.out / "README.md").write_text("\n\n".join(summary) + "\n")
    print(*remarks, f"wrote {args.out}/README.md and tables/plots in {time.perf_counter() - started:.0f} s",
          sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
