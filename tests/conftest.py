import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from deinsum.runtime import kernels as _kernels

#: Tests route GEMMs as fixed here, never by a measurement's outcome: every library this install has
#: (MKL for square and MTTKRP GEMMs, numpy's BLAS for TTM steps, the streaming kernels on their shapes).
PINNED_ROUTES = {"why": "pinned by tests/conftest.py", "rates": None,
                 "routes": {**_kernels.forced_routes("mkl"), "ttm": "numpy",
                            "streamed": _kernels.forced_routes("stream")["streamed"]}}
_kernels.use_gemm_routes(PINNED_ROUTES)
