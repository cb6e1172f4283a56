#!/usr/bin/env python3
"""Parallel .npy I/O on data bigger than one rank should hold: load, MTTKRP, save, and the emitted script.

A float64 tensor X (cubic, --gib GiB; 3 by default) and two factor matrices are written under --dir; then,
--repeat times, in turn:

* ``mpiexec -n P`` of this file as a worker: ``DistributedArray.load`` of X (even layout), the MTTKRP
  ``deinsum.einsum("ijk,ja,ka->ia", X, B, C)`` with B and C whole on every rank and the result distributed,
  ``save`` of the result, then ``save`` of X (its throughput); each rank's resident-set peak (``VmHWM``,
  after the result's save) against 1.25 x (its block of X + its block of the result) + 64 MiB;
* one process's ``numpy.load`` and ``numpy.save`` of X (and ``numpy.save`` plus ``fsync``, as the
  parallel save syncs its file before the rename);

and once, the emitted MTTKRP script with ``--inputs local --result distributed --load X B C --save out``:
each rank's ``VmHWM`` against the size of X (no rank may hold a whole operand). Medians [min, max].

    python scripts/bench_npyio.py [--gib 3] [-n 4] [--repeat 3] [--dir /work/tmp-io] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
EQUATION = "ijk,ja,ka->ia"
MIB = 2**20


def vmhwm() -> int:
    """This process's resident-set peak in bytes (``VmHWM`` of /proc/self/status)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def write_inputs(folder: Path, gib: float, rank: int) -> list[Path]:
    """X (n^3 float64, written in slabs: never whole in memory), B and C (n x rank)."""
    n = round((gib * 2**30 / 8) ** (1 / 3))
    rng = np.random.default_rng(0)
    paths = [folder / name for name in ("x.npy", "b.npy", "c.npy")]
    x = np.lib.format.open_memmap(paths[0], mode="w+", dtype=np.float64, shape=(n, n, n))
    rows = max(1, 64 * MIB // (n * n * 8))
    for start in range(0, n, rows):
        x[start:start + rows] = rng.standard_normal((min(rows, n - start), n, n))
    x.flush()
    del x
    for path in paths[1:]:
        np.save(path, rng.standard_normal((n, rank)))
    return paths


def worker(paths: list[str], out: str) -> None:
    """One launch: load X, MTTKRP, save the result, save X; rank 0 prints one JSON line."""
    from mpi4py import MPI
    import deinsum
    from deinsum import DistributedArray
    comm = MPI.COMM_WORLD
    b, c = (np.load(p) for p in paths[1:])
    seconds = {}

    def timed(name, step):
        comm.Barrier()
        start = MPI.Wtime()
        value = step()
        comm.Barrier()
        seconds[name] = MPI.Wtime() - start
        return value

    x = timed("load", lambda: DistributedArray.load(paths[0], "even", comm))
    prog = deinsum.compile(EQUATION, x.shape, b.shape, c.shape)
    m = timed("mttkrp", lambda: prog(x, b, c))
    timed("save result", lambda: m.save(out + ".m.npy"))
    peak = vmhwm()
    timed("save", lambda: x.save(out + ".x.npy"))
    mine = {"peak": peak, "block": 0 if x.local is None else x.local.nbytes,
            "result": 0 if m.local is None else m.local.nbytes, "moved": prog.last_run.bytes_received}
    ranks = comm.gather(mine, root=0)
    want = np.einsum(EQUATION, np.load(paths[0], mmap_mode="r")[:3], b, c) if comm.rank == 0 else None
    if comm.rank == 0:
        got = np.load(out + ".m.npy")
        assert np.allclose(got[:3], want), "the saved result is not numpy's"
        print(json.dumps({"seconds": seconds, "ranks": ranks, "bytes": x.size * 8, "shape": x.shape}))


def run_script(script: str, argv: list[str]) -> None:
    """Run an emitted script's own code (as ``python -m mpi4py`` would), then gather each rank's ``VmHWM``."""
    import types
    from mpi4py import MPI
    module = types.ModuleType("emitted")
    sys.modules["emitted"] = module
    exec(compile(Path(script).read_text(), script, "exec"), module.__dict__)
    status = module.script_main(module.__dict__, argv)
    peaks = MPI.COMM_WORLD.gather(vmhwm(), root=0)
    if MPI.COMM_WORLD.rank == 0:
        print(json.dumps({"status": status, "peaks": peaks}))


def mpiexec(nprocs: int, *args: str, timeout: float = 1800) -> dict:
    cmd = [str(Path(sys.executable).with_name("mpiexec")), "-n", str(nprocs), sys.executable, "-m", "mpi4py",
           __file__, *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if res.returncode != 0:
        raise SystemExit(f"mpiexec failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1]), res.stdout


NUMPY = """
import json, os, sys, time
import numpy as np
seconds = {}
t = time.perf_counter(); x = np.load(sys.argv[1]); seconds["np.load"] = time.perf_counter() - t
t = time.perf_counter(); np.save(sys.argv[2], x); seconds["np.save"] = time.perf_counter() - t
os.unlink(sys.argv[2])   # each save writes a new file, as the parallel save's temporary is
t = time.perf_counter()
with open(sys.argv[2], "wb") as f:
    np.save(f, x)
    f.flush()
    os.fsync(f.fileno())
seconds["np.save+fsync"] = time.perf_counter() - t
print(json.dumps(seconds))
"""


def spread(samples) -> str:
    return f"{np.median(samples):.2f} [{min(samples):.2f}, {max(samples):.2f}]"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=3.0, help="size of X in GiB (float64, cubic)")
    ap.add_argument("--rank", type=int, default=24, help="columns of the factor matrices")
    ap.add_argument("-n", "--nprocs", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=Path("/work/tmp-io"), help="where the files go (deleted after)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--worker", nargs=4, metavar=("X", "B", "C", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--run-script", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker[:3], args.worker[3])
        return 0
    if args.run_script:
        run_script(args.run_script[0], args.run_script[1:])
        return 0

    import deinsum
    args.dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        folder = Path(tmp)
        paths = write_inputs(folder, args.gib, args.rank)
        size = paths[0].stat().st_size
        out = str(folder / "out")
        numpy_script = folder / "numpy_io.py"
        numpy_script.write_text(NUMPY)
        runs, baseline = [], []
        for _ in range(args.repeat):   # interleaved: the parallel launch, then one numpy process; each writes
            runs.append(mpiexec(args.nprocs, "--worker", *map(str, paths), out)[0])   # new files (the last
            _remove(out + ".x.npy", out + ".m.npy")                                     # run's removed)
            res = subprocess.run([sys.executable, str(numpy_script), str(paths[0]), out + ".np.npy"],
                                 capture_output=True, text=True, check=True, timeout=1800)
            baseline.append(json.loads(res.stdout))
            _remove(out + ".np.npy")
        n = round((size / 8) ** (1 / 3))
        prog = deinsum.compile(EQUATION, (n, n, n), (n, args.rank), (n, args.rank), inputs="local",
                               result="distributed")
        script = prog.to_script(folder / "mttkrp.py", nprocs=args.nprocs)
        emitted, text = mpiexec(args.nprocs, "--run-script", str(script), "--load", *map(str, paths), "--save",
                                out + ".script.npy")

    gib = size / 2**30
    print(f"X {runs[0]['shape']} float64, {gib:.2f} GiB; P = {args.nprocs}, 1 BLAS thread per rank; "
          f"{os.cpu_count()} cores ({_cpu()}); medians [min, max] of {args.repeat} interleaved runs")
    table = {}
    for name, ours, theirs in [("load", "load", "np.load"), ("save", "save", "np.save"),
                               ("save", "save", "np.save+fsync")]:
        a = [size / r["seconds"][ours] / 2**30 for r in runs]
        b = [size / r[theirs] / 2**30 for r in baseline]
        ratio = [x / y for x, y in zip(a, b)]
        table[f"{name} vs {theirs}"] = {"deinsum GiB/s": a, "numpy GiB/s": b, "ratio": ratio}
        print(f"  {name:<5} {spread(a)} GiB/s vs {theirs:<14} {spread(b)} GiB/s: ratio {spread(ratio)}")
    for phase in ("mttkrp", "save result"):
        print(f"  {phase:<12} {spread([r['seconds'][phase] for r in runs])} s")
    print("  rank  VmHWM MiB  bound MiB (1.25 x (X block + result block) + 64)  X block MiB  moved bytes")
    worst = 0.0
    for rank, r in enumerate(runs[-1]["ranks"]):
        bound = 1.25 * (r["block"] + r["result"]) + 64 * MIB
        worst = max(worst, r["peak"] / bound)
        print(f"  {rank:>4}  {r['peak'] / MIB:>9.0f}  {bound / MIB:>9.0f}  {r['block'] / MIB:>11.0f}  {r['moved']}")
    print(f"  largest peak / bound: {worst:.3f} ({'within' if worst <= 1 else 'OVER'} the bound)")
    peaks = emitted["peaks"]
    print(f"  emitted script (--inputs local --result distributed, --load/--save): exit {emitted['status']}; "
          f"VmHWM per rank {[round(p / MIB) for p in peaks]} MiB vs X {size / MIB:.0f} MiB: largest "
          f"{max(peaks) / size:.2f} x X")
    print("  " + "\n  ".join(line for line in text.splitlines() if line.startswith(("  total", "  compute"))))
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "numpy": baseline, "table": table, "emitted": emitted,
                                         "bytes": size, "nprocs": args.nprocs}, indent=2))
    return 0


def _remove(*paths: str) -> None:
    for path in paths:
        Path(path).unlink(missing_ok=True)


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


if __name__ == "__main__":
    sys.exit(main())
