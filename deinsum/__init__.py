"""deinsum: communication-optimal distributed einsums.

>>> import numpy as np, deinsum
>>> prog = deinsum.compile("ij,jk->ik", (4, 5), (5, 6))
>>> prog.decomposition.steps[0].kind
'GEMM'
"""
from __future__ import annotations

from .darray import DistributedArray
from .decompose import Decomposition, Step, decompose
from .errors import DeinsumError
from .layout import Layout
from .sequence import SequencePlan, plan_sequence

from .version import __version__


def compile(equation: str, *shapes, nprocs: int | None = None, dtype=None, memory: int | str | None = None,
            inputs: str = "global", result: str = "all", threads: str | None = "auto", layouts: dict | None = None,
            casting: str = "safe", device: str = "cpu"):
    """Compile ``equation`` into a :class:`~deinsum.program.Program`.

    With ``shapes`` it plans concretely; without, it is parametric and plans (and
    caches) per distinct shapes and number of ranks at call time; ``nprocs`` fixes
    the number of ranks for plans, reports and scripts (a call on another number is
    an error). ``memory`` is the peak memory a rank may use, in bytes (an integer
    or text like ``"4GiB"``, ``"500MB"``), its own blocks included: plans and the
    SOAP bounds are made for it. ``inputs`` says where operands start ('global' on every rank, 'root'
    on rank 0, 'local' blocks); ``result`` where the result ends ('all', 'root',
    'distributed').
    The defaults, global and all, are those of every entry point (calls, plans,
    reports, emitted scripts and the command line) unless one is given.
    ``threads='auto'`` pins BLAS threads at the first run (and lowers them at a run
    with more ranks per node) so that ranks per node x threads = cores
    (threadpoolctl); ``None`` leaves them alone. ``layouts``
    pins the layout of inputs (``"in0"`` or ``0``, ...) or of a distributed result
    (``"out"``, with ``result='distributed'`` compiled or in the call; an error with 'all' or 'root'):
    a :class:`~deinsum.layout.Layout`, ``"even"``, ``"replicated"``, ``"root"`` or
    text like ``"2x2: 0, 1"`` (see :mod:`deinsum.darray`); the plan is built
    around them: ``'local'`` inputs start in their pinned layouts, ``'global'`` and
    ``'root'`` ones are distributed into them first. Unpinned ``'local'`` inputs
    and a ``'distributed'`` result get the layouts the planner chooses (see
    ``Program.input_blocks``). Use the program as a context manager (or call
    ``close()``) to free its MPI objects. ``dtype``
    and ``casting`` follow ``numpy.einsum``: inputs are cast to ``dtype`` (default:
    their result type) only where numpy's ``casting`` rule allows it. A run refuses
    a plan whose peak footprint per rank exceeds ``memory`` bytes (default: the
    node's free memory shared by its ranks). ``device='gpu'`` runs each rank's local contractions on a GPU
    with CuPy (the node's GPUs shared by its ranks; MPI staged through host memory);
    a call with CuPy arrays gets a CuPy result (inputs resident on the GPU), with
    numpy arrays a numpy result (copies to and from the GPU timed in ``last_run``).
    """
    from .program import Program
    return Program(equation, tuple(shapes) if shapes else None, nprocs, dtype, memory, inputs, result, threads,
                   layouts, casting, device)


def einsum(equation: str, *arrays, comm=None, result=None, **options):
    """Distributed ``numpy.einsum``: every rank passes the arrays and gets the result.

    With :class:`DistributedArray` operands (plain arrays beside them are replicated) the result is a
    DistributedArray (``result`` may name its layout, or ask ``'all'``/``'root'``); otherwise every rank
    passes whole arrays and gets the whole result. ``options`` go to :func:`compile`. Collective: an
    error on any rank (even while compiling) is raised on every rank.
    """
    import numpy as np

    from .runtime.checks import collectively
    from .program import call_comm
    comm, bad_comm = call_comm(comm, arrays)
    shapes = [np.shape(a) for a in arrays]   # reads .shape where there is one (DistributedArray, CuPy)

    def build():
        if bad_comm:
            raise DeinsumError(bad_comm)
        return compile(equation, *shapes, **options)

    prog = collectively(comm, build, error=DeinsumError)
    with prog:
        return prog(*arrays, comm=comm, result=result)


__all__ = ["DeinsumError", "Decomposition", "DistributedArray", "Layout", "SequencePlan", "Step", "compile",
           "decompose", "einsum", "plan_sequence", "__version__"]
