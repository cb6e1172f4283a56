"""Emitted standalone scripts: correctness at P = 1, 3, 4, 8, errors, and no code injection."""
import ast
import importlib
import re
import traceback
import types
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import deinsum
from deinsum.peak import SLACK
from deinsum import DeinsumError
from deinsum.emit import RUNTIME_MARK, generate, runtime_files
from deinsum.runtime.bundle import package_name, unpack
from mpirun import run_mpi_script
from random_cases import random_einsums
from suite import SUITE, shapes_for

PACKAGE = Path(deinsum.__file__).parent

EMIT_P = [1, 3, 4, 8]
SCRIPT_CASES = [(eq, shapes_for(eq, sizes)) for eq, sizes in SUITE.values()] + random_einsums(200, seed=11)
#: The default run: the suite and 14 random einsums (every dtype with each of six pairs of modes).
SUBSET = SCRIPT_CASES[:len(SUITE) + 14]

# Runs every emitted script's own code (script_main, run) inside one launch per P.
DRIVER = """
import json, sys, types
import numpy as np
from mpi4py import MPI
from deinsum.layout import Layout
comm = MPI.COMM_WORLD
failures = 0
jobs = json.load(open(sys.argv[1]))
for path, models, received in jobs:
    module = types.ModuleType("emitted")   # a module, as `python -m mpi4py` runs it (dataclasses look it up)
    sys.modules["emitted"] = module
    ns = module.__dict__
    exec(compile(open(path).read(), path, "exec"), ns)
    status = ns["script_main"](ns, ["--validate", "--seed", "3"])
    whole = ns["validation_operands"](ns["INPUT_SHAPES"], ns["DTYPE"], 3)
    blocks = [Layout(*layout).block(comm.rank) for layout in ns["ENTRY"]]   # local inputs: this rank's blocks
    operands = ([None if b is None else x[b] for x, b in zip(whole, blocks)] if ns["INPUTS"] == "local"
                else whole if comm.rank == 0 or ns["INPUTS"] == "global" else [None] * len(whole))
    with ns["script_runtime"](ns, comm) as rt:
        ns["run"](rt, *operands)
    # the plan's model (library tables) and volume model: the script's own tables must move exactly that
    measured, model = (rt.log.bytes_sent, rt.log.bytes_received), tuple(models[comm.rank])
    if status != 0 or measured != model or rt.model_bytes != model or model[1] != received[comm.rank]:
        failures += 1
        print(f"FAIL {path} status={status} bytes={measured} model={model} volume={received[comm.rank]}", file=sys.stderr)
total = comm.allreduce(failures)
if comm.rank == 0:
    print(f"SCRIPTS {len(jobs)} FAILED {total}")
"""


#: The acceptance case of the script's size: MTTKRP 64^3 x 8, inputs and result on rank 0; and with local inputs.
MTTKRP = ("ijk,ja,ka->ia", [(64, 64, 64), (64, 8), (64, 8)], np.float64, "root", "root")
MTTKRP_LOCAL = [("ijk,ja,ka->ia", [(64, 64, 64), (64, 8), (64, 8)], np.float32, "local", result)
                for result in ("all", "root")]


def check_scripts(nprocs, cases, tmp_path, extra=(), tight=False, prefetch=False):
    """Emit ``cases`` (and ``extra``) for ``nprocs`` ranks and run each script's own code in one launch; with
    ``tight``, each plan is made for half the way from its unconstrained peak to its data share (the feasible
    ones: rounds and leaner grids), and at least a few run in rounds (with ``prefetch``, a few prefetch)."""
    jobs, in_rounds, prefetched = [], 0, 0
    modes = [("root", "root"), ("global", "all"), ("root", "all"), ("global", "root"), ("local", "distributed"),
             ("global", "distributed")]
    dtypes = [np.float64, np.float32, np.complex128, np.complex64]
    # the first 24 cases take every (dtype, modes) pair
    for n, (eq, shapes, dtype, inputs, result) in enumerate([(eq, shapes, dtypes[n % 4], *modes[n // 4 % 6])
                                                             for n, (eq, shapes) in enumerate(cases)] + list(extra)):
        if inputs == "local" and deinsum.compile(eq, *shapes).decomposition.prepass:
            inputs = "global"   # a pre-pass (a sum inside one operand) takes whole inputs
        prog = deinsum.compile(eq, *shapes, dtype=dtype, inputs=inputs, result=result, prefetch=prefetch)
        plan = prog.plan(nprocs=nprocs)
        if tight:
            share = SLACK + plan.data_share * plan.dtype.itemsize
            prog.memory = share + max(0, plan.peak_bytes - share) // 2
            plan = prog.plan(nprocs=nprocs)
            if not plan.feasible:
                continue
            in_rounds += any(g.rounds for g in plan.groups)
            prefetched += any(m.prefetch for m in plan.moves)
        jobs.append((str(prog.to_script(tmp_path / f"p{n}.py", nprocs=nprocs)), plan.model_bytes(),
                     plan.received_bytes().tolist()))
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    (tmp_path / "driver.py").write_text(DRIVER)
    res = run_mpi_script(nprocs, tmp_path / "driver.py", str(tmp_path / "jobs.json"), timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"SCRIPTS {len(jobs)} FAILED 0" in res.stdout, res.stderr[-3000:]
    assert not tight or in_rounds >= 3, in_rounds
    assert not prefetch or prefetched >= 3, prefetched


@pytest.mark.parametrize("nprocs", EMIT_P)
def test_emitted_scripts_match_numpy_and_model(nprocs, tmp_path):
    check_scripts(nprocs, SUBSET, tmp_path, extra=[MTTKRP, *MTTKRP_LOCAL])


@pytest.mark.slow
@pytest.mark.parametrize("nprocs", EMIT_P)
def test_emitted_scripts_match_numpy_and_model_on_210_einsums(nprocs, tmp_path):
    check_scripts(nprocs, SCRIPT_CASES, tmp_path)


@pytest.mark.parametrize("nprocs", [p if p == 4 else pytest.param(p, marks=pytest.mark.slow) for p in EMIT_P])
def test_emitted_scripts_with_rounds_match_numpy_and_model(nprocs, tmp_path):
    check_scripts(nprocs, SUBSET, tmp_path, tight=True)


def test_emitted_scripts_that_prefetch_match_numpy_and_model(tmp_path):
    """The tight plans with prefetch on, at P = 4: each prefetching group's listing posts round t + 1's move
    (rt.post, an MPI_Ialltoallw) before round t computes; equal to numpy, bytes == model."""
    check_scripts(4, SUBSET, tmp_path, tight=True, prefetch=True)


@pytest.mark.parametrize("name", ["MTTKRP-O3-M0", "3MM"])
def test_standalone_script_runs_under_mpiexec(name, tmp_path):
    eq, sizes = SUITE[name]
    shapes = shapes_for(eq, sizes)
    prog = deinsum.compile(eq, *shapes)
    script = prog.to_script(tmp_path / "prog.py", nprocs=3)
    inputs = []
    rng = np.random.default_rng(5)
    for n, s in enumerate(shapes):
        np.save(tmp_path / f"x{n}.npy", rng.standard_normal(s))
        inputs.append(str(tmp_path / f"x{n}.npy"))
    out = tmp_path / "out.npy"
    size_arg = ",".join(f"{c}={n}" for c, n in sizes.items())
    res = run_mpi_script(3, script, "--size", size_arg, "--load", *inputs, "--save", str(out),
                         "--validate", "--repeat", "3", timeout=120)
    assert res.returncode == 0, res.stderr
    assert "validate: OK" in res.stdout and "measured bytes == model" in res.stdout
    assert "total" in res.stdout and "[" in res.stdout  # median [min, max]
    want = np.einsum(eq, *[np.load(p) for p in inputs])
    np.testing.assert_allclose(np.load(out), want, rtol=1e-10, atol=1e-12)


def test_wrong_number_of_ranks_fails_on_every_rank(tmp_path):
    script = deinsum.compile("ij,jk->ik", (6, 5), (5, 4)).to_script(tmp_path / "p.py", nprocs=2)
    res = run_mpi_script(3, script, timeout=60)
    assert res.returncode != 0
    assert "planned for 2 ranks, not 3" in res.stderr


@pytest.mark.parametrize("size,message", [("i=7", "planned for i=6"), ("q=3", "INDEX one of"),
                                          ("i=x", "expected INDEX=INT")])
def test_wrong_sizes_fail_clearly(size, message, tmp_path):
    script = deinsum.compile("ij,jk->ik", (6, 5), (5, 4)).to_script(tmp_path / "p.py", nprocs=2)
    res = run_mpi_script(2, script, "--size", size, timeout=60)
    assert res.returncode == 2 and message in res.stderr
    assert len([line for line in res.stderr.splitlines() if line.startswith("error:")]) == 1


def test_bad_arguments_are_one_line_errors_before_any_work(tmp_path):
    """Issue 30: an absurd --repeat, a negative --memory and a directory given to --load."""
    script = deinsum.compile("ij,jk->ik", (6, 5), (5, 4)).to_script(tmp_path / "p.py", nprocs=2)
    (tmp_path / "a_dir").mkdir()
    np.save(tmp_path / "b.npy", np.zeros((5, 4)))
    for args, message in [(("--repeat", str(10**22)), "--repeat 10000000000000000000000: expected 1 to 100,000 runs"),
                          (("--memory", "-5"), "--memory='-5': expected bytes >= 1"),
                          (("--memory", "4 parsecs"), "--memory='4 parsecs': expected bytes >= 1"),
                          (("--load", str(tmp_path / "a_dir"), str(tmp_path / "b.npy")), "a_dir: a directory, not a .npy")]:
        res = run_mpi_script(2, script, *args, timeout=60)
        assert res.returncode == 2 and message in res.stderr, (args, res.stderr)
        assert len(res.stderr.splitlines()) == 1, res.stderr


@pytest.mark.parametrize("nprocs", [3, *[pytest.param(p, marks=pytest.mark.slow) for p in (2, 4)]])
def test_a_failing_script_exits_2_on_every_launch(nprocs, tmp_path):
    """The error line and exit code 2 every time: no rank is killed by the launcher (``BAD TERMINATION``)."""
    script = deinsum.compile("ijk,ja,ka->ia", (7, 5, 3), (5, 2), (3, 2)).to_script(tmp_path / "p.py", nprocs=nprocs)
    for args in [("--size", "i=8"), ("--load", str(tmp_path / "missing.npy"), "b.npy", "c.npy")] * 4:
        res = run_mpi_script(nprocs, script, *args, timeout=60)
        assert res.returncode == 2, (args, res.returncode, res.stderr)
        assert len(res.stderr.splitlines()) == 1 and res.stderr.startswith("error: "), res.stderr


def test_bad_input_file_fails_clearly(tmp_path):
    script = deinsum.compile("ij,jk->ik", (6, 5), (5, 4)).to_script(tmp_path / "p.py", nprocs=2)
    np.save(tmp_path / "a.npy", np.zeros((6, 5)))
    np.save(tmp_path / "b.npy", np.zeros((5, 3)))
    res = run_mpi_script(2, script, "--load", str(tmp_path / "a.npy"), str(tmp_path / "b.npy"),
                         "--save", str(tmp_path / "o.npy"), timeout=60)
    assert res.returncode == 2 and "expected shape (5, 4), not (5, 3)" in res.stderr
    assert not (tmp_path / "o.npy").exists()


HOSTILE = [
    "ij,jk->ik'); import os; os.system('echo pwned'); ('",
    'ij,jk->ik"""\nimport os\n"""',
    "ij,jk->ik\\",
    "i#j,jk->ik",
    "ij,jk->ik\n__import__('os')",
    "ij;jk->ik",
    "ij,jk->ik{}",
    "ij,jk->i k)",
]


@pytest.mark.parametrize("equation", HOSTILE)
def test_hostile_equations_are_rejected_before_codegen(equation, tmp_path):
    with pytest.raises(DeinsumError):
        deinsum.compile(equation, (2, 3), (3, 4)).to_script(tmp_path / "p.py", nprocs=2)
    assert not (tmp_path / "p.py").exists()


def test_user_text_only_reaches_string_literals(tmp_path):
    # letters numpy would not take but opt_einsum does: they must appear only inside string constants
    eq = "ǅλ,λж->ǅж"
    path = deinsum.compile(eq, (3, 4), (4, 5)).to_script(tmp_path / "p.py", nprocs=2)
    tree = ast.parse(path.read_text())
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert not any(c in name for name in names for c in "ǅλж")
    constants = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)]
    assert eq in constants


def test_unicode_program_runs(tmp_path):
    path = deinsum.compile("ǅλ,λж->ǅж", (3, 4), (4, 5)).to_script(tmp_path / "p.py", nprocs=2)
    res = run_mpi_script(2, path, "--validate", timeout=60)
    # numpy.einsum rejects non-ASCII letters: validation is done by the program against a renamed equation
    assert res.returncode == 0, res.stderr
    assert "validate: OK" in res.stdout


def test_scripts_take_every_mode_of_inputs_and_result(tmp_path):
    prog = deinsum.compile("ij,jk->ik", (2, 3), (3, 4), inputs="local", result="distributed")
    text = prog.to_script(tmp_path / "p.py", nprocs=2).read_text()
    plan = prog.plan(nprocs=2)
    assert "INPUTS = 'local'" in text and "RESULT = 'distributed'" in text
    assert all(f"L{k} = {(lay.shape, lay.grid, lay.axes, lay.partial)!r}" in text
               for k, lay in zip(re.search(r"^ENTRY = \[L(\d+), L(\d+)\]", text, re.M).groups(), plan.entry))
    text = prog.to_script(tmp_path / "p.py", nprocs=2, inputs="global", result="root").read_text()
    assert "INPUTS = 'global'" in text and "RESULT = 'root'" in text
    with pytest.raises(DeinsumError, match="inputs='blocks': expected one of global, root, local"):
        prog.to_script(tmp_path / "p.py", nprocs=2, inputs="blocks")


@pytest.mark.parametrize("nprocs", [1, 3, 4, pytest.param(8, marks=pytest.mark.slow)])
def test_a_script_on_local_blocks_loads_and_saves_blocks(nprocs, tmp_path):
    """MTTKRP with --inputs local --result distributed: every rank reads its block of each --load file (one in
    float32, one in Fortran order and big-endian) and writes its block of --save; the saved result is numpy's."""
    shapes = [(30, 20, 16), (20, 6), (16, 6)]
    prog = deinsum.compile("ijk,ja,ka->ia", *shapes, inputs="local", result="distributed")
    script = prog.to_script(tmp_path / "p.py", nprocs=nprocs)
    rng = np.random.default_rng(nprocs)
    x, b, c = (rng.standard_normal(s) for s in shapes)
    b = b.astype(np.float32)
    files = [tmp_path / name for name in ("x.npy", "b.npy", "c.npy")]
    for path, array in zip(files, (x, b, np.asfortranarray(c).astype(">f8"))):
        np.save(path, array)
    out = tmp_path / "out.npy"
    out.write_bytes(b"the previous result")
    res = run_mpi_script(nprocs, script, "--load", *map(str, files), "--save", str(out), "--validate", timeout=120)
    assert res.returncode == 0 and "validate: OK" in res.stdout and "measured bytes == model" in res.stdout, res.stderr
    assert "inputs start as each rank's block, result ends as each rank's block" in res.stdout
    np.testing.assert_allclose(np.load(out), np.einsum("ijk,ja,ka->ia", x, b, c), rtol=1e-12, atol=1e-12)
    if nprocs == 3:   # a file of another shape: one line, exit 2, the previous result kept
        np.save(files[1], np.ones((20, 5)))
        out.write_bytes(b"the previous result")
        res = run_mpi_script(nprocs, script, "--load", *map(str, files), "--save", str(out), timeout=120)
        assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
        assert "--load operand 1" in res.stderr and "expected shape (20, 6), not (20, 5)" in res.stderr
        assert out.read_bytes() == b"the previous result"


def test_script_write_is_atomic_on_error(tmp_path):
    target = tmp_path / "p.py"
    with pytest.raises(DeinsumError):
        deinsum.compile("ij,jk->ik", (2, 3), (3, 4)).to_script(target, nprocs=0)
    assert not target.exists() and not list(tmp_path.iterdir())


def test_emitted_script_is_valid_python_and_readable(tmp_path):
    prog = deinsum.compile("ijk,ja,ka->ia", (8, 9, 10), (9, 4), (10, 4))
    path = prog.to_script(tmp_path / "p.py", nprocs=8, inputs="root", result="root")
    text = path.read_text()
    compile(text, str(path), "exec")
    # a listing of the schedule, in its order: per group a function, then named collectives on named communicators
    plan = prog.plan(nprocs=8, inputs="root", result="root")
    (group,) = plan.groups
    dims = ", ".join(f"{c}={p}" for c, p in zip(group.indices, group.grid.dims))
    lines = [f"def group0(rt, {', '.join(name for name, _ in group.reads)}):",
             f'    """ja,ka->jka; ijk,jka->ia on grid 0 ({dims}), 8 rank(s)."""']
    for k, move in enumerate(plan.moves):
        if move.tensor == "out":
            lines.append("def run(rt, in0, in1, in2):")
        for s, e in enumerate(move.exchanges):
            comm = "rt.world" if e.comm.group is None else e.comm.name
            if comm != "rt.world":
                lines.append(f"    {comm} = rt.cart_sub(GRID0, remain={e.comm.remain!r})")
            lines.append(f"    {move.tensor} = rt.{e.kind}({move.tensor}, move={k}{f', step={s}' if s else ''}, comm={comm})"
                         + (f"  # MPI_{e.mpi}" if e.mpi else "  # no MPI call: a local slice"))
        if k == len(plan.moves) - 2:
            subs = tuple(sub for _, sub in group.reads)
            names = ", ".join(name for name, _ in group.reads)
            lines += ["    if rt.member(GRID0):", f"        out = rt.contract_group({subs!r}, 'ia', {names})  # KRP, TDOT"]
    listing = text[:text.index(RUNTIME_MARK)]
    where = [listing.find("\n" + line + "\n") for line in lines]
    assert -1 not in where and where == sorted(where), [line for line, at in zip(lines, where) if at < 0]
    assert any(e.comm.name == "grid0_sum" for m in plan.moves for e in m.exchanges)   # MTTKRP's partial sums
    assert "  # MPI_Reduce_scatter" in listing and "  # MPI_Alltoallw" in listing   # what MPI runs, line by line
    # then the runtime, once: the bundle's code verbatim and the package files as its payload
    assert text.count(RUNTIME_MARK) == 1 and (PACKAGE / "runtime" / "bundle.py").read_text() in text
    assert not re.search(r"^\s*class ", listing, flags=re.M)   # the listing defines functions only
    assert subprocess.run([sys.executable, "-c", "import ast,sys; ast.parse(open(sys.argv[1]).read())", str(path)],
                          timeout=60).returncode == 0


@pytest.mark.parametrize("inputs, result, device", [("root", "root", "cpu"), ("global", "all", "cpu"),
                                                    ("local", "distributed", "cpu"), ("root", "root", "gpu"),
                                                    ("local", "distributed", "gpu")])
def test_script_size_does_not_grow_with_the_ranks(inputs, result, device):
    """MTTKRP 64^3 x 8: each rank builds its own tables from the layouts, so P = 8, 512 and 65,536 give
    scripts of the same size that define every name they use, <= 80 kB with every mode of inputs and
    result, the block I/O of local inputs and distributed results, and on the GPU (issue 28)."""
    prog = deinsum.compile("ijk,ja,ka->ia", (64, 64, 64), (64, 8), (64, 8), inputs=inputs, result=result)
    sizes = {}
    for nprocs in (8, 512, 65536):
        text = generate(prog.plan(nprocs=nprocs), device=device)
        compile(text, "script", "exec")
        sizes[nprocs] = len(text.encode())
        assert RUNTIME_MARK in text
    assert max(sizes.values()) <= 80_000, sizes
    assert max(sizes.values()) - min(sizes.values()) < 2_000, sizes   # other grids and moves, no per-rank data


def payload_of(text: str) -> str:
    """The RUNTIME payload of an emitted script's text."""
    block = text[text.index("RUNTIME = (\n"):]
    return "".join(re.findall(r'^    "([^"]*)"$', block[:block.index("\n)\n")], flags=re.M))


def test_the_runtime_is_carried_byte_for_byte_and_tracebacks_name_its_files():
    """The payload unpacks to the package's own files; an error inside the runtime's code shows the file
    under deinsum/ and the line of that file."""
    text = generate(deinsum.compile("ij,jk->ik", (4, 3), (3, 2)).plan(nprocs=2))
    payload = payload_of(text)
    assert unpack(payload) == {path: (PACKAGE / path).read_text() for path in runtime_files("cpu")}
    gpu = payload_of(generate(deinsum.compile("ij,jk->ik", (4, 3), (3, 2)).plan(nprocs=2), device="gpu"))
    assert unpack(gpu) == {path: (PACKAGE / path).read_text() for path in runtime_files("gpu")}
    module = types.ModuleType("emitted_tb")
    exec(compile(text, "script", "exec"), module.__dict__)
    tables = importlib.import_module(package_name(payload) + ".tables")
    layout = importlib.import_module(package_name(payload) + ".layout")
    with pytest.raises(ValueError) as info:
        tables.rank_tables(layout.Layout((4,), (2,), (0,)), layout.Layout((5,), (2,), (0,)), 2, 0)
    frame = traceback.extract_tb(info.tb)[-1]
    assert frame.filename.endswith("/deinsum/tables.py")
    assert frame.line == (PACKAGE / "tables.py").read_text().splitlines()[frame.lineno - 1].strip()


def test_scripts_run_in_one_process_install_their_runtime_once():
    """Each script defines its own ``Bundle`` class: a second script with the same runtime (the tests' driver
    runs many in one process) finds the first one's modules and neither unpacks nor adds a finder again."""
    text = generate(deinsum.compile("ij,jk->ik", (4, 3), (3, 2)).plan(nprocs=2))
    name = package_name(payload_of(text))
    for n in range(2):
        exec(compile(text, "script", "exec"), types.ModuleType(f"emitted_{n}").__dict__)
    assert sum(getattr(finder, "name", None) == name for finder in sys.meta_path) == 1


def test_emitted_script_defines_every_name_it_uses(tmp_path):
    pyflakes = pytest.importorskip("pyflakes.api")
    from pyflakes.reporter import Reporter
    import io
    for eq, shapes in [("ijk,ja,ka->ia", [(8, 9, 10), (9, 4), (10, 4)]), ("ii->", [(5, 5)])]:
        text = generate(deinsum.compile(eq, *shapes).plan(nprocs=4, inputs="root", result="root"))
        out = io.StringIO()
        assert pyflakes.check(text, "script", Reporter(out, out)) == 0, out.getvalue()   # no warning at all


def test_a_reduction_in_parts_runs_in_an_emitted_script(tmp_path):
    """Matrix multiply in rounds whose partial result is reduced to rank 0 in parts: the listing says so and
    the script validates, bytes == model."""
    prog = deinsum.compile("ij,jk->ik", (64, 64), (64, 64), inputs="root", result="root")
    free = prog.plan(nprocs=2)
    share = SLACK + free.data_share * 8
    for twelfths in range(1, 12):     # the first memory between the share and the free peak that takes parts
        prog.memory = share + (free.peak_bytes - share) * twelfths // 12
        plan = prog.plan(nprocs=2)
        if plan.feasible and any(m.parts for m in plan.moves):
            break
    else:
        pytest.fail("no memory between the data share and the free peak reduces in parts")
    script = prog.to_script(tmp_path / "p.py", nprocs=2)
    assert "rt.in_parts('reduce', out, move=" in script.read_text()
    res = run_mpi_script(2, script, "--validate", timeout=60)
    assert res.returncode == 0 and "validate: OK" in res.stdout and "measured bytes == model" in res.stdout, res.stderr
