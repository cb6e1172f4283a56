"""deinsum: communication-optimal distributed einsums.

>>> import deinsum
>>> prog = deinsum.compile("ij,jk->ik", (4, 5), (5, 6))
>>> prog.decomposition.steps[0].kind
'GEMM'
"""
from __future__ import annotations

import importlib

import numpy as np

try:   # mpi4py loads an MPI library at import: the `mpich` extra's wheel, else the one the loader finds (the site's)
    importlib.import_module("mpi4py.MPI")
except RuntimeError as exc:
    raise ImportError(f"deinsum runs on MPI and mpi4py finds no MPI library ({str(exc).splitlines()[0]}): install "
                      f"the mpich extra (pip install 'deinsum[mpich]') to run on this machine alone, or make the "
                      f"site's MPI found (e.g. module load openmpi) on a cluster") from exc

from .darray import DistributedArray
from .darray_numpy import route_einsums
from .decompose import Decomposition, Step, decompose
from .errors import DeinsumError
from .options import check_choice
from .runtime.checks import check_cast
from .layout import Layout
from .sequence import SequencePlan, plan_sequence

from .version import __version__


def compile(equation: str, *shapes, nprocs: int | None = None, dtype=None, memory: int | str | None = None,
            inputs: str = "global", result: str = "all", threads: str | None = "auto", layouts: dict | None = None,
            casting: str = "safe", device: str = "cpu", prefetch: bool = False):
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
    numpy arrays a numpy result (copies to and from the GPU timed in ``last_run``). ``prefetch=True`` lets a group
    that must run in rounds post the next round's exchange before computing the current one, where the memory
    holds two rounds' pieces and room for a third in MPI's buffers (off by default: on 2 cores it did not help,
    see ``bench-results/rounds.json``).
    """
    from .program import Program
    return Program(equation, tuple(shapes) if shapes else None, nprocs, dtype, memory, inputs, result, threads,
                   layouts, casting, device, prefetch)


def einsum(*operands, out=None, optimize=None, order="K", comm=None, inputs="global", result=None, shapes=None,
           **options):
    """Distributed ``numpy.einsum``, with numpy's arguments: every rank passes the arrays and gets the result.

    ``operands`` is ``(subscripts, *arrays)`` or numpy's interleaved form ``(a, [0, 1], b, [1, 2], [0, 2])``.
    ``out`` is filled where the whole result lands (as numpy's, under ``casting``), ``order`` lays the
    result out (``'K'``, ``'C'``, ``'F'``, ``'A'``), ``dtype`` and ``casting`` are numpy's; ``optimize`` is
    accepted and left to the plan. ``inputs='root'``: rank 0 passes the arrays, the others ``None``;
    ``inputs='local'``: each rank passes its block (``Program.input_blocks``) and ``shapes`` gives the global
    shapes. With :class:`DistributedArray` operands (plain arrays beside them are replicated) the result is a
    DistributedArray (``result`` may name its layout, or ask ``'all'``/``'root'``). ``options`` go to
    :func:`compile`. Collective: an error on any rank (even while compiling) is raised on every rank.

    >>> import numpy as np
    >>> float(einsum(np.arange(3.), [0], np.arange(3.), [0], []))   # numpy's interleaved form, one rank
    5.0
    """
    from .program import call_comm
    from .runtime.checks import agree, collectively
    equation, arrays = _equation_and_arrays(operands)
    comm, bad_comm = call_comm(comm, arrays)

    def build():
        if bad_comm:
            raise DeinsumError(bad_comm)
        check_choice("order", order, ("K", "A", "C", "F"))
        if out is not None and not isinstance(out, np.ndarray):
            raise DeinsumError(f"out: expected a numpy array, not {type(out).__name__}")
        if out is not None and result == "distributed":
            raise DeinsumError("out= takes a whole result: result 'all' or 'root', not 'distributed'")
        if inputs == "local" and shapes is None and not any(isinstance(a, DistributedArray) for a in arrays):
            raise DeinsumError("inputs='local' blocks do not tell the global shapes: pass shapes=[...], one per "
                               "operand (see Program.input_blocks)")
        # the shapes of a call are checked (and, from rank 0, shared) by the call itself
        return compile(equation, *(shapes or ()), inputs=inputs, **options)

    prog = collectively(comm, build, error=DeinsumError)
    with prog:
        res = prog(*arrays, comm=comm, result=result)
    if isinstance(res, DistributedArray):
        return res
    failure = None
    if res is not None and out is not None:
        try:
            check_cast(np.result_type(res), out.dtype, prog.casting, "out", DeinsumError)
            if out.shape != np.shape(res):
                raise DeinsumError(f"out: shape {out.shape}, the result has {np.shape(res)}")
            np.copyto(out, res, casting="unsafe")
        except DeinsumError as exc:
            failure = str(exc)
    agree(comm, {}, failure, DeinsumError)
    if out is not None and res is not None:
        return out
    return res if res is None or np.ndim(res) == 0 else np.asarray(res, order=order) if order != "K" else res


route_einsums(einsum)   # numpy's einsum-like functions on DistributedArrays run through it


def _equation_and_arrays(operands) -> tuple:
    """``(subscripts, arrays)`` of numpy's two call forms (subscripts first, or arrays and sublists of
    integers 0-51 and ``...``, with an optional output sublist), as numpy labels them.

    >>> _equation_and_arrays(("ij,jk", 1, 2))
    ('ij,jk', (1, 2))
    >>> _equation_and_arrays((1, [0, Ellipsis], 2, [Ellipsis, 27], [0, 27]))
    ('A...,...b->Ab', (1, 2))
    """
    if not operands:
        raise DeinsumError("einsum needs subscripts and operands")
    if isinstance(operands[0], str):
        return operands[0], tuple(operands[1:])

    def labels(sublist, n) -> str:
        try:
            items = list(sublist)
        except TypeError:
            raise DeinsumError(f"einsum: sublist {n} is {sublist!r}, not a list of integers 0-51 and ...") from None
        text = ""
        for item in items:
            if item is Ellipsis:
                text += "..."
            elif isinstance(item, (int, np.integer)) and not isinstance(item, bool) and 0 <= item < 52:
                text += chr(ord("A") + item) if item < 26 else chr(ord("a") + item - 26)
            else:
                raise DeinsumError(f"einsum: sublist {n} holds {item!r}; expected integers 0-51 and ...")
        return text

    pairs, output = operands[:len(operands) // 2 * 2], operands[len(operands) // 2 * 2:]
    arrays = tuple(pairs[0::2])
    terms = [labels(sub, n) for n, sub in enumerate(pairs[1::2])]
    return ",".join(terms) + ("->" + labels(output[0], len(terms)) if output else ""), arrays


__all__ = ["DeinsumError", "Decomposition", "DistributedArray", "Layout", "SequencePlan", "Step", "compile",
           "decompose", "einsum", "plan_sequence", "__version__"]
