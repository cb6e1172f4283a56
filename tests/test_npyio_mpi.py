"""Parallel .npy files under real mpiexec (issue 27): DistributedArray.load and save, each rank its own
block. Bit-exact round trips between any two numbers of ranks and any layouts; files of numpy (C and
Fortran order, big-endian, format versions 1 to 3) load, saved files read with numpy.load; bad files are one
line on every rank; a save killed in the middle leaves the previous file."""
import json
from pathlib import Path

import numpy as np
import pytest
from numpy.lib import format as npformat

from mpirun import run_mpi_script

#: name: (shape, dtype) of the arrays every launch loads and saves (bool and 0-d and empty ones too; "long" has
#: blocks of runs long enough to be read without data sieving).
CASES = {"f8": ((6, 4, 5), "f8"), "f4": ((7, 5), "f4"), "c16": ((5, 6), "c16"), "i8": ((11,), "i8"),
         "bool": ((4, 3), "?"), "u2": ((3, 2, 5), "u2"), "c8": ((), "c8"), "empty": ((0, 3), "f8"),
         "long": ((16, 2, 4096), "f8")}
#: How numpy writes a file of each case: C order (version 1), Fortran order, big-endian, versions 2 and 3.
FORMATS = {
    "c": lambda f, x: np.save(f, x),
    "fortran": lambda f, x: np.save(f, np.array(x, order="F")),
    "big": lambda f, x: np.save(f, x.astype(x.dtype.newbyteorder(">"))),
    "v2": lambda f, x: npformat.write_array(f, x, version=(2, 0)),
    "v3": lambda f, x: npformat.write_array(f, np.array(x, order="F").astype(x.dtype.newbyteorder(">")), version=(3, 0)),
}

DRIVER = r'''
import json, os, signal, sys
import numpy as np
from mpi4py import MPI
from deinsum import DeinsumError, DistributedArray, Layout
from deinsum.darray import as_layout
from deinsum.runtime import npyio

comm = MPI.COMM_WORLD
P = comm.size
job = json.load(open(sys.argv[1]))
failures = []


def layouts(nd):
    """even, replicated, root, nested, split and replicated, last axis split (short runs in the file)."""
    a = 2 if P >= 2 else 1
    out = ["even", "replicated", "root"]
    if nd:
        out += [f"{a}x{P // a}: 1.0" + ", -" * (nd - 1), f"{a}x{P // a}: 0" + ", -" * (nd - 1),
                f"{P}: " + "-, " * (nd - 1) + "0"]
    return out


def same(got, want):
    return got.dtype == want.dtype.newbyteorder("=") and got.shape == want.shape and (
        np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want, got.dtype).tobytes())


for k, (path, ref) in enumerate(job["load"]):   # each file in two of the layouts, in turn
    want = np.load(ref)
    specs = layouts(want.ndim)
    for spec in dict.fromkeys([specs[k % len(specs)], specs[(k + 1) % len(specs)]]):
        x = DistributedArray.load(path, spec, comm, shape=want.shape, dtype=want.dtype)
        if x.layout != as_layout(spec, want.shape, P) or (x.local is None) != (x.block is None) or (
                x.local is not None and not same(x.local, want[x.block])):
            failures.append(f"load {os.path.basename(path)} as {spec}")

for k, (ref, out) in enumerate(job["save"]):
    want = np.load(ref)
    specs = layouts(want.ndim)
    layout = as_layout(specs[k % len(specs)], want.shape, P)
    if want.dtype.kind == "i":   # partial sums: rank 0's block is the array, the others add zeros
        layout = Layout(want.shape, (P,), (None,) * want.ndim, (0,))
        local = want if comm.rank == 0 else np.zeros_like(want)
    else:
        local = None if layout.block(comm.rank) is None else want[layout.block(comm.rank)].copy()
    DistributedArray(local, want.dtype, layout=layout, comm=comm).save(out)

for path, ref in job.get("convert", []):   # numpy's 'safe' casts on the way in, asked for
    want = np.load(ref).astype(np.complex128)
    x = DistributedArray.load(path, "even", comm, dtype=np.complex128, casting="safe")
    if x.dtype != np.complex128 or (x.local is not None and not same(x.local, want[x.block])):
        failures.append(f"load {path} as complex128")

for name, call, expected in job.get("errors", []):
    message = None
    try:
        eval(call)
    except DeinsumError as exc:
        message = str(exc)
    messages = comm.allgather(message)
    if len(set(messages)) != 1 or message is None or expected not in message or "\n" in message:
        failures.append(f"error {name}: {messages}")

if job.get("fail_one_write"):   # a write that fails on rank 1 only (as MPI-IO reports it, after the collective
    transfer = npyio._transfer  # calls): the same error everywhere, the previous file kept, no temporary left
    def failing(comm, path, amode, *args):
        transfer(comm, path, amode, *args)
        if amode == MPI.MODE_WRONLY and comm.rank == 1:
            raise OSError("disk full (simulated)")
    npyio._transfer = failing
    message = None
    try:
        DistributedArray.full((40, 30), 7.0, "even", comm=comm).save(job["fail_one_write"])
    except DeinsumError as exc:
        message = str(exc)
    if len(set(comm.allgather(message))) != 1 or "rank 1: OSError: disk full (simulated)" not in (message or ""):
        failures.append(f"failed write: {message}")
    npyio._transfer = transfer

if job.get("kill"):   # rank 1 dies by SIGKILL as it starts writing its block; mpiexec ends the job
    target = job["kill"]
    DistributedArray.full((40, 30), 1.0, "even", comm=comm).save(target)   # the previous file
    transfer = npyio._transfer
    def dying(comm, path, amode, *args):
        if amode == MPI.MODE_WRONLY and comm.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return transfer(comm, path, amode, *args)
    npyio._transfer = dying
    DistributedArray.full((40, 30), 2.0, "even", comm=comm).save(target)
    print("SAVED DESPITE THE KILL", flush=True)

failures = comm.allgather(failures)
if comm.rank == 0:
    bad = [f for rank in failures for f in rank]
    print("\n".join(bad))
    print(f"NPYIO FAILED {len(bad)}")
'''


def reference(shape, dtype, seed) -> np.ndarray:
    """Random bits of ``dtype`` (NaNs with payloads and all): any bit lost on the way shows."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    count = int(np.prod(shape))
    return np.frombuffer(rng.bytes(count * dtype.itemsize), dtype).reshape(shape).copy()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """References (``ref/<case>.npy``) and numpy's files of them in every format (``np/<case>-<format>.npy``)."""
    root = tmp_path_factory.mktemp("npyio")
    for folder in ("ref", "np"):
        (root / folder).mkdir()
    for seed, (name, (shape, dtype)) in enumerate(CASES.items()):
        want = reference(shape, dtype, seed)
        np.save(root / "ref" / f"{name}.npy", want)
        for fmt, write in FORMATS.items():
            with open(root / "np" / f"{name}-{fmt}.npy", "wb") as f:
                write(f, want)
    return root


def run(nprocs, job, tmp_path, timeout=300):
    (tmp_path / "driver.py").write_text(DRIVER)
    spec = tmp_path / f"job-{nprocs}.json"
    spec.write_text(json.dumps(job))
    return run_mpi_script(nprocs, tmp_path / "driver.py", str(spec), timeout=timeout)


def check(nprocs, job, tmp_path):
    res = run(nprocs, job, tmp_path)
    assert res.returncode == 0 and "NPYIO FAILED 0" in res.stdout, res.stdout[-3000:] + res.stderr[-3000:]


def save_job(files, folder: Path, loads=()) -> dict:
    """Load ``loads`` (pairs of file, reference) in every layout; save every case into ``folder``."""
    folder.mkdir(exist_ok=True)
    return {"load": [[str(p), str(r)] for p, r in loads],
            "save": [[str(files / "ref" / f"{name}.npy"), str(folder / f"{name}.npy")] for name in CASES]}


def saved(files, folder: Path) -> list:
    return [(folder / f"{name}.npy", files / "ref" / f"{name}.npy") for name in CASES]


def check_saved_with_numpy(files, folder: Path):
    for name in CASES:
        got, want = np.load(folder / f"{name}.npy"), np.load(files / "ref" / f"{name}.npy")
        assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes(), name
        assert not [p for p in folder.iterdir() if "deinsum-tmp" in p.name]


def numpy_files(files) -> list:
    return [(files / "np" / f"{name}-{fmt}.npy", files / "ref" / f"{name}.npy") for name in CASES for fmt in FORMATS]


def test_save_at_one_p_load_at_another(files, tmp_path):
    """Saved at P = 1, loaded (in the layouts in turn) and saved again at 3, then 4, then 2: the pairs (1, 3),
    (3, 4), (4, 2); numpy's files of every format load at P = 3 and 4; every saved file reads bit-exact with
    numpy.load."""
    previous = ()
    for nprocs in (1, 3, 4, 2):
        folder = tmp_path / f"saved-{nprocs}"
        theirs = numpy_files(files) if nprocs in (3, 4) else []
        check(nprocs, save_job(files, folder, [*previous, *theirs]), tmp_path)
        check_saved_with_numpy(files, folder)
        previous = saved(files, folder)


@pytest.mark.slow
def test_save_at_every_p_load_at_every_p(files, tmp_path):
    """a, b in 1..8: each P saves its set (and loads numpy's files), then each P loads all eight."""
    for a in range(1, 9):
        check(a, save_job(files, tmp_path / f"saved-{a}", numpy_files(files)), tmp_path)
        check_saved_with_numpy(files, tmp_path / f"saved-{a}")
    every = [pair for a in range(1, 9) for pair in saved(files, tmp_path / f"saved-{a}")]
    for b in range(1, 9):
        check(b, {"load": [[str(p), str(r)] for p, r in every], "save": []}, tmp_path)


def test_bad_files_are_one_line_on_every_rank(files, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    good = files / "ref" / "f8.npy"
    data = good.read_bytes()
    (bad / "truncated.npy").write_bytes(data[:-8])
    np.save(bad / "objects.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    (bad / "text.npy").write_text("not numpy at all\n")
    np.savez(bad / "archive.npz", x=np.ones(3))
    (bad / "future.npy").write_bytes(data[:6] + b"\x09\x00" + data[8:])
    (bad / "previous.npy").write_bytes(b"keep")
    load = "DistributedArray.load({!r}, comm=comm{})"
    errors = [
        ("missing", load.format(str(bad / "missing.npy"), ""), "missing.npy: no such file"),
        ("truncated", load.format(str(bad / "truncated.npy"), ""), "truncated: 952 bytes of data, expected 960"),
        ("objects", load.format(str(bad / "objects.npy"), ""), "holds Python objects (a pickled array)"),
        ("text", load.format(str(bad / "text.npy"), ""), "text.npy: not a readable .npy file"),
        ("npz", load.format(str(bad / "archive.npz"), ""), "not an .npz archive"),
        ("version", load.format(str(bad / "future.npy"), ""), "format version 9.0, expected 1.0, 2.0 or 3.0"),
        ("directory", load.format(str(bad), ""), "a directory, not a .npy file"),
        ("shape", load.format(str(good), ", shape=(6, 4)"), "expected shape (6, 4), not (6, 4, 5)"),
        ("dtype", load.format(str(good), ", dtype='f4'"), "cannot cast float64 to float32 under casting='equiv'"),
        ("layout", load.format(str(good), ", layout='9x9: 0, 1, -'"), "grid (9, 9) needs 81 ranks"),
        ("no folder", f"DistributedArray.full((2, 2), 0, comm=comm).save({str(bad / 'no' / 'x.npy')!r})",
         "does not exist"),
        ("a folder", f"DistributedArray.full((2, 2), 0, comm=comm).save({str(bad)!r})", "is a directory"),
    ]
    job = {"load": [], "save": [], "errors": errors, "fail_one_write": str(bad / "previous.npy"),
           "convert": [[str(files / "np" / f"{name}-{fmt}.npy"), str(files / "ref" / f"{name}.npy")]
                       for name in ("f4", "i8", "u2") for fmt in ("c", "v3")]}
    check(3, job, tmp_path)
    assert (bad / "previous.npy").read_bytes() == b"keep"
    assert not [p for p in bad.iterdir() if "deinsum-tmp" in p.name]


def test_a_rank_killed_during_save_leaves_the_previous_file(tmp_path):
    """Rank 1 dies by SIGKILL as it starts writing: mpiexec ends the job (no hang), the target still holds
    the previous save, and the next save removes any temporary the killed one left."""
    target = tmp_path / "x.npy"
    res = run(3, {"load": [], "save": [], "kill": str(target)}, tmp_path, timeout=120)
    assert res.returncode != 0 and "SAVED DESPITE THE KILL" not in res.stdout, res.stdout + res.stderr
    got = np.load(target)
    assert got.shape == (40, 30) and (got == 1.0).all()
    from mpi4py import MPI
    from deinsum import DistributedArray
    DistributedArray.full((2, 2), 3.0, comm=MPI.COMM_SELF).save(target)
    assert (np.load(target) == 3.0).all()
    assert not [p for p in tmp_path.iterdir() if "deinsum-tmp" in p.name]
