import compileall
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# The tests start some 400 processes (MPI ranks, scripts) next to two workers on a few cores: one BLAS and OpenMP
# thread each, as ``threads='auto'`` pins ranks that share a node's cores, so that no library starts idle threads
# that spin (OpenBLAS's cost 0.09 s of CPU per process at its import here). Set before numpy is imported here; every
# process the tests start inherits it.
for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

import deinsum
from deinsum.runtime import blas as _blas

#: Tests route GEMMs as fixed here, never by a measurement's outcome: every library this install has
#: (MKL for square and MTTKRP GEMMs, numpy's BLAS for TTM steps, the streaming kernels on their shapes).
PINNED_ROUTES = {"why": "pinned by tests/conftest.py", "rates": None,
                 "routes": {**_blas.forced_routes("mkl"), "ttm": "numpy",
                            "streamed": _blas.forced_routes("stream")["streamed"]}}
_blas.use_gemm_routes(PINNED_ROUTES)


@pytest.fixture(scope="session", autouse=True)
def _gemm_routes_cache(tmp_path_factory):
    """Processes the tests start (emitted scripts, mpiexec jobs) measure their GEMM routes into a cache of
    this session's, never the user's."""
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    if before is None:
        del os.environ["XDG_CACHE_HOME"]
    else:
        os.environ["XDG_CACHE_HOME"] = before


def pytest_configure(config):
    """Compile the package's bytecode once (``__pycache__``, ignored by git): some 400 MPI ranks and scripts the
    tests start import it, and where bytecode is not written (``PYTHONDONTWRITEBYTECODE``) each would compile
    every module anew, 0.1-0.2 s of CPU apiece."""
    if not hasattr(config, "workerinput"):
        compileall.compile_dir(Path(deinsum.__file__).parent, quiet=2)   # (a read-only tree: nothing said)
