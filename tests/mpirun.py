"""Launch real MPI jobs from tests: ``mpiexec -n N python -m mpi4py script``.

The ``mpiexec`` used is the one next to ``sys.executable`` (installed by the
``mpich`` wheel), and every launch has a timeout so no test can hang.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

MPIEXEC = str(Path(sys.executable).with_name("mpiexec"))


#: The P a sweep over P = 1..8 runs by default: one rank, odd and uneven blocks, a 2-D and a 3-D grid (the
#: emitted scripts' P); the other P under ``-m slow``.
DEFAULT_P = (1, 3, 4, 8)


def some_p(*default: int, every=range(1, 9)) -> list:
    """The P of ``every`` for ``pytest.mark.parametrize``, those outside ``default`` marked slow."""
    return [p if p in default else pytest.param(p, marks=pytest.mark.slow) for p in every]


@dataclass(frozen=True)
class MPIResult:
    returncode: int
    stdout: str
    stderr: str


def run_mpi(nprocs: int, code: str, *args: str, tmp_path: Path, timeout: float = 120.0) -> MPIResult:
    """Run ``code`` (Python source) on ``nprocs`` ranks and return rc/stdout/stderr."""
    script = tmp_path / f"mpi_job_{nprocs}.py"
    script.write_text(textwrap.dedent(code))
    return run_mpi_script(nprocs, script, *args, timeout=timeout)


def run_mpi_script(nprocs: int, script: Path, *args: str, timeout: float = 120.0) -> MPIResult:
    """Run an existing script file on ``nprocs`` ranks with a timeout."""
    cmd = [MPIEXEC, "-n", str(nprocs), sys.executable, "-m", "mpi4py", str(script), *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"mpiexec -n {nprocs} {script.name} timed out after {timeout}s\n"
                             f"stdout: {exc.stdout}\nstderr: {exc.stderr}") from None
    return MPIResult(proc.returncode, proc.stdout, proc.stderr)


def check_mpi(nprocs: int, code: str, *args: str, tmp_path: Path, timeout: float = 120.0) -> str:
    """Like :func:`run_mpi` but assert success and return stdout."""
    res = run_mpi(nprocs, code, *args, tmp_path=tmp_path, timeout=timeout)
    assert res.returncode == 0, f"rank failure (rc={res.returncode})\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    return res.stdout
