"""deinsum: communication-optimal distributed einsums.

>>> import numpy as np, deinsum
>>> prog = deinsum.compile("ij,jk->ik", (4, 5), (5, 6))
>>> prog.decomposition.steps[0].kind
'GEMM'
"""
from __future__ import annotations

from .decompose import Decomposition, Step, decompose
from .errors import DeinsumError

__version__ = "0.1.0"


def compile(equation: str, *shapes, nprocs: int | None = None, dtype=None, memory: int | None = None,
            inputs: str = "global", output: str = "all", threads: str | None = "auto", casting: str = "safe"):
    """Compile ``equation`` into a :class:`~deinsum.program.Program`.

    With ``shapes`` it plans concretely; without, it is parametric and plans (and
    caches) per distinct shapes and number of ranks at call time. ``memory`` is
    the local memory per rank in elements (for the SOAP bounds). ``inputs`` says
    where operands start ('global' on every rank, 'root' on rank 0, 'local'
    blocks); ``output`` where the result goes ('all', 'root', 'distributed').
    ``threads='auto'`` pins BLAS threads at the first run so that ranks per node
    x threads = cores (threadpoolctl); ``None`` leaves them alone. ``dtype`` and
    ``casting`` follow ``numpy.einsum``: inputs are cast to ``dtype`` (default: their
    result type) only where numpy's ``casting`` rule allows it. A run refuses a plan
    whose peak footprint per rank exceeds ``memory`` elements (default: the memory
    the rank has).
    """
    from .program import Program
    return Program(equation, tuple(shapes) if shapes else None, nprocs, dtype, memory, inputs, output, threads,
                   casting)


def einsum(equation: str, *arrays, comm=None, **options):
    """Distributed ``numpy.einsum``: every rank passes the arrays and gets the result.

    Collective: an error on any rank (even while compiling) is raised on every rank.
    """
    import numpy as np
    from mpi4py import MPI

    from .codegen.checks import collectively
    comm = MPI.COMM_WORLD if comm is None else comm
    prog = collectively(comm, lambda: compile(equation, *[np.shape(a) for a in arrays], **options),
                        error=DeinsumError)
    return prog(*arrays, comm=comm)


__all__ = ["DeinsumError", "Decomposition", "Step", "compile", "decompose", "einsum", "__version__"]
