"""numpy's functions, ufuncs and operators on distributed arrays (``__array_function__``, ``__array_ufunc__``).

:class:`NumpyProtocols` is the base of :class:`~deinsum.darray.DistributedArray`: numpy's own functions run
distributed on it, collectively (every rank calls them with the same arguments; an error on one rank, or
arguments the ranks disagree on, is the same one-line :class:`~deinsum.errors.DeinsumError` on all).

* einsum-like (``np.einsum``, ``np.tensordot``, ``np.matmul`` and ``@``) run through ``deinsum.einsum``:
  plain arrays beside DistributedArrays are whole operands every rank passes; the result is a
  DistributedArray where the plan leaves it.
* ``np.sum``, ``np.trace`` reduce each rank's block and add the partial sums across the grid dimensions
  that split the reduced axes; the result keeps the kept axes' splits (replicated over those dimensions).
  ``np.transpose`` permutes the blocks and the layout: nothing moves.
* ``np.vdot`` and ``np.linalg.norm`` (Frobenius, vector 2-norm) add each block's part in one allreduce.
* Elementwise ufuncs and operators (``+ - * / ** -x abs(x) np.exp np.sqrt < == ...``) keep the left
  DistributedArray's layout: other DistributedArrays (of the same shape) are redistributed to it; plain
  arrays that broadcast to its shape and scalars are taken block by block.
* Every result of a whole reduction or contraction that is 0-d is a numpy scalar, the same on every rank.
* ``np.asarray(x)`` / ``np.array(x)`` gather the whole array to every rank, only where it fits the free
  memory of every rank; ``np.shape``, ``np.ndim``, ``np.size`` read the global shape (no communication).

Any other numpy function returns NotImplemented, so numpy raises its ``TypeError`` ("no implementation
found"); a ufunc's ``reduce``/``accumulate``/``outer``/``at``, ``out=`` and ``where=`` are DeinsumErrors.

This module sits below ``deinsum.einsum`` (in :mod:`deinsum`), which hands itself over with
:func:`route_einsums`.

>>> from mpi4py import MPI
>>> from deinsum import DistributedArray
>>> x = DistributedArray.from_global(np.arange(6.0).reshape(2, 3), "even", MPI.COMM_SELF)
>>> y = np.einsum("ij,jk->ik", x, np.ones((3, 2))) + 1     # a DistributedArray
>>> np.asarray(y).tolist(), np.sum(x), np.sum(x.T, axis=1, keepdims=True).shape
([[4.0, 4.0], [13.0, 13.0]], np.float64(15.0), (3, 1))
"""
from __future__ import annotations

import string

import numpy as np
from numpy.lib.array_utils import normalize_axis_tuple
from numpy.lib.mixins import NDArrayOperatorsMixin

from .errors import DeinsumError
from .layout import Layout
from .memory import default_memory
from .runtime.checks import agree, collectively, node_place

__all__ = ["NumpyProtocols", "route_einsums"]

_EINSUM: list = []   # [deinsum.einsum], see route_einsums


def route_einsums(einsum) -> None:
    """Run numpy's einsum-like functions on DistributedArrays through ``einsum`` (``deinsum.einsum``, which
    sits above this module: ``deinsum/__init__`` calls this once)."""
    _EINSUM[:] = [einsum]


class NumpyProtocols(NDArrayOperatorsMixin):
    """numpy's protocols of a distributed array (``local``, ``layout``, ``comm``, ``dtype``, ``shape`` and the
    methods ``gather``, ``redistribute``, ``norm``, ``vdot`` of :class:`~deinsum.darray.DistributedArray`)."""

    __slots__ = ()

    def __array_function__(self, func, types, args, kwargs):
        handler = _FUNCTIONS.get(func)
        if handler is None or not all(issubclass(t, (NumpyProtocols, np.ndarray)) for t in types):
            return NotImplemented
        return handler(*args, **kwargs)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if any(hasattr(a, "__array_ufunc__") and not isinstance(a, (NumpyProtocols, np.ndarray))
               for a in inputs + tuple(kwargs.get("out", ()))):
            return NotImplemented
        if ufunc is np.matmul and method == "__call__":
            return _matmul(*inputs, **kwargs)
        return _elementwise(ufunc, method, inputs, kwargs)

    def __array__(self, dtype=None, copy=None):
        """The whole array on every rank, where it fits every rank's free memory (else a DeinsumError)."""
        from mpi4py import MPI

        def check():
            if copy is False:
                raise DeinsumError(f"np.asarray({self!r}, copy=False): gathering a distributed array copies it")
            return np.dtype(self.dtype if dtype is None else dtype)

        want = collectively(self.comm, check, error=DeinsumError)
        agree(self.comm, {"np.asarray dtype": want.str}, error=DeinsumError)
        free = self.comm.allreduce(default_memory(node_place(self.comm)[1]), op=MPI.MIN)
        whole = self.size * self.dtype.itemsize
        if whole > free:   # the same verdict on every rank: one size, one agreed memory
            raise DeinsumError(f"np.asarray({self!r}): the whole array is {whole:,} bytes, more than the "
                               f"{free:,} bytes free per rank; keep it distributed (or gather(root=0) if "
                               f"one rank's memory holds it)")
        return self.gather().astype(want, copy=False)

    @property
    def T(self):
        """The transpose (``np.transpose``): the blocks and the layout permuted, nothing moves."""
        return _transpose(self)


# ---- helpers ----------------------------------------------------------------------------------------

def _comm(values):
    """The communicator of the first distributed array among ``values``."""
    return next(v for v in values if isinstance(v, NumpyProtocols)).comm


def _settled(comm, check):
    """``check()`` -> ``(value, facts)`` on every rank; the same one-line DeinsumError on every rank if it
    fails on any, or if the ranks' facts differ; else this rank's value."""
    value, facts = collectively(comm, check, error=DeinsumError)
    agree(comm, facts, error=DeinsumError)
    return value


def _operands(name: str, *operands) -> dict:
    """What the ranks must agree on about the operands of ``name``: a distributed array's shape, layout and
    dtype, a plain array's shape and dtype, a scalar's value."""
    def described(x):
        if isinstance(x, NumpyProtocols):
            return "distributed", x.shape, x.layout.spec(), x.dtype.str
        return ("scalar", repr(x)) if np.ndim(x) == 0 else ("array", np.shape(x), np.asarray(x).dtype.str)

    return {f"{name} operand {n}": described(x) for n, x in enumerate(operands)}


def _refuse_partial(x, what: str) -> None:
    """A DeinsumError if ``x`` holds partial sums (redistribute those to a layout first)."""
    if x.layout.partial:
        raise DeinsumError(f"{what}: {x!r} holds partial sums; redistribute it to a layout first")


def _blocks_of(plain, like):
    """The whole array ``plain`` (every rank passes it; its shape that of ``like``) as a distributed array in
    ``like``'s layout: each rank keeps its block, a view."""
    block = like.block
    return type(like)(None if block is None else plain[block], plain.dtype, layout=like.layout, comm=like.comm)


def _whole(result):
    """A contraction's result: a 0-d distributed array as a numpy scalar on every rank, else as it is."""
    return result.gather()[()] if isinstance(result, NumpyProtocols) and result.ndim == 0 else result


def _reduced(x, local, axes, shape, summed, dtype):
    """The sum of each rank's partial ``local`` (None where it holds nothing) over the grid dimensions
    ``summed`` (and ``x``'s own partial ones): kept output axes split as ``axes`` says, replicated over the
    summed dimensions; a 0-d result is a numpy scalar on every rank."""
    layout = x.layout
    partial = Layout(shape, layout.grid, axes, layout.partial + summed)
    out = type(x)(local, dtype, layout=partial, comm=x.comm)
    if not shape:
        return out.gather()[()]
    return out.redistribute(Layout(shape, layout.grid, axes))


def _no_out(what: str, out, **unsupported):
    """A DeinsumError for ``out=`` and for any of ``unsupported`` given (not None)."""
    if out is not None:
        raise DeinsumError(f"{what}: out= is not supported on DistributedArrays: use the result it returns")
    given = [k for k, v in unsupported.items() if v is not None]
    if given:
        raise DeinsumError(f"{what}: {', '.join(k + '=' for k in given)} not supported on DistributedArrays")


# ---- einsum-like: through deinsum.einsum -------------------------------------------------------------

def _einsum(*operands, out=None, **kwargs):
    """``np.einsum``: ``deinsum.einsum`` with numpy's ``dtype``, ``order``, ``casting`` (``optimize`` ignored)."""
    collectively(_comm(operands + (out,)), _no_out, "np.einsum", out, error=DeinsumError)
    kwargs.pop("optimize", None)
    return _whole(_EINSUM[0](*operands, **kwargs))


def _tensordot(a, b, axes=2):
    """``np.tensordot``: ``axes`` an integer N (the last N axes of ``a`` with the first N of ``b``) or a pair
    of axis sequences (or of axes)."""
    def check():
        shape_a, shape_b = np.shape(a), np.shape(b)
        try:
            if len(axes) != 2:
                raise DeinsumError(f"np.tensordot: axes={axes!r}: expected an integer or a pair of axis sequences")
            pair = [list(normalize_axis_tuple(side, n, "axes")) for side, n in zip(axes, (len(shape_a), len(shape_b)))]
        except TypeError:
            count = int(axes)
            if not 0 <= count <= min(len(shape_a), len(shape_b)):
                raise DeinsumError(f"np.tensordot: axes={count} with operands of {len(shape_a)} and "
                                   f"{len(shape_b)} axes") from None
            pair = [list(range(len(shape_a) - count, len(shape_a))), list(range(count))]
        first, second = pair
        if len(first) != len(second) or any(shape_a[i] != shape_b[j] for i, j in zip(first, second)):
            raise DeinsumError(f"np.tensordot: axes {first} of {shape_a} do not match axes {second} of {shape_b}")
        letters = iter(string.ascii_letters)
        left = [next(letters) for _ in shape_a]
        right = [left[first[second.index(j)]] if j in second else next(letters) for j in range(len(shape_b))]
        kept = [c for i, c in enumerate(left) if i not in first] + [c for j, c in enumerate(right) if j not in second]
        equation = f"{''.join(left)},{''.join(right)}->{''.join(kept)}"
        return equation, {"np.tensordot": equation} | _operands("np.tensordot", a, b)

    return _whole(_EINSUM[0](_settled(_comm((a, b)), check), a, b))


def _matmul(a, b, out=None, dtype=None, casting="same_kind", **unsupported):
    """``np.matmul`` and ``@``: 1-D, 2-D and stacked (broadcast ``...``) operands, as an einsum."""
    def check():
        _no_out("np.matmul", out, **unsupported)
        shape_a, shape_b = np.shape(a), np.shape(b)
        if not shape_a or not shape_b:
            raise DeinsumError(f"np.matmul: {shape_a} @ {shape_b}: a 0-d operand (use * for a scalar)")
        inner = shape_b[-2] if len(shape_b) > 1 else shape_b[0]
        if shape_a[-1] != inner:
            raise DeinsumError(f"np.matmul: {shape_a} @ {shape_b}: {shape_a[-1]} columns, {inner} rows")
        stacked = "..." if len(shape_a) > 1 or len(shape_b) > 1 else ""
        equation = (("...ij" if len(shape_a) > 1 else "j") + "," + ("...jk" if len(shape_b) > 1 else "j") + "->"
                    + stacked + ("i" if len(shape_a) > 1 else "") + ("k" if len(shape_b) > 1 else ""))
        return equation, {"np.matmul": equation} | _operands("np.matmul", a, b)

    equation = _settled(_comm((a, b) + tuple(out or ())), check)
    options = {} if dtype is None else {"dtype": dtype}
    return _whole(_EINSUM[0](equation, a, b, casting=casting, **options))


# ---- reductions and transposes on blocks ---------------------------------------------------------------

def _sum(a, axis=None, dtype=None, out=None, keepdims=False, initial=None, where=None):
    """``np.sum``: each block's sum over ``axis``, then the partial sums added (a scalar for all axes)."""
    def check():
        _no_out("np.sum", out, initial=initial, where=where)
        summed = normalize_axis_tuple(range(a.ndim) if axis is None else axis, a.ndim)
        kind = np.sum(np.zeros((1,) * a.ndim, a.dtype), axis=summed, dtype=dtype).dtype
        return (summed, kind), {"np.sum axis": summed, "keepdims": bool(keepdims), "dtype": kind.str,
                                **_operands("np.sum", a)}

    summed, kind = _settled(a.comm, check)
    lay = a.layout
    kept = [x for x in range(a.ndim) if keepdims or x not in summed]
    local = None if a.local is None else np.sum(a.local, axis=summed, dtype=kind, keepdims=bool(keepdims))
    shape = tuple(1 if x in summed else a.shape[x] for x in kept)
    axes = tuple(None if x in summed else lay.axes[x] for x in kept)
    return _reduced(a, local, axes, shape, tuple(g for x in summed for g in lay.axis_dims(x)), kind)


def _trace(a, offset=0, axis1=0, axis2=1, dtype=None, out=None):
    """``np.trace`` (any ``offset``): each block's part of the diagonal, then the partial sums added."""
    def check():
        _no_out("np.trace", out)
        first, second = normalize_axis_tuple((axis1, axis2), a.ndim)
        kind = np.trace(np.zeros((1,) * a.ndim, a.dtype), axis1=first, axis2=second, dtype=dtype).dtype
        return (first, second, int(offset), kind), {"np.trace axes": (first, second), "offset": int(offset),
                                                     "dtype": kind.str, **_operands("np.trace", a)}

    first, second, diagonal, kind = _settled(a.comm, check)
    lay, block = a.layout, a.block
    local = None
    if block is not None:   # the global diagonal a[i, i + offset] is the block's a[l, l + local offset]
        shift = diagonal + block[first].start - block[second].start
        local = np.trace(a.local, offset=shift, axis1=first, axis2=second, dtype=kind)
    kept = [x for x in range(a.ndim) if x not in (first, second)]
    summed = lay.axis_dims(first) + lay.axis_dims(second)
    return _reduced(a, local, tuple(lay.axes[x] for x in kept), tuple(a.shape[x] for x in kept), summed, kind)


def _transpose(a, axes=None):
    """``np.transpose``: each block transposed, the layout's axes permuted (no communication)."""
    def check():
        order = tuple(reversed(range(a.ndim))) if axes is None else normalize_axis_tuple(axes, a.ndim, "axes")
        if len(order) != a.ndim:
            raise DeinsumError(f"np.transpose: axes {tuple(axes)} do not permute the {a.ndim} axes of {a!r}")
        return order, {"np.transpose axes": order, **_operands("np.transpose", a)}

    order = _settled(a.comm, check)
    lay = a.layout
    layout = Layout(tuple(a.shape[x] for x in order), lay.grid, tuple(lay.axes[x] for x in order), lay.partial)
    return type(a)(None if a.local is None else a.local.transpose(order), a.dtype, layout=layout, comm=a.comm)


def _vdot(a, b):
    """``np.vdot``: ``sum(conj(a) * b)`` of two arrays of one size, at least one distributed (the other
    moved to its layout, or a plain one taken block by block); a scalar on every rank."""
    first = a if isinstance(a, NumpyProtocols) else b

    def check():
        if np.size(a) != np.size(b):
            raise DeinsumError(f"np.vdot: sizes {np.size(a)} and {np.size(b)} differ")
        for x in (a, b):
            if isinstance(x, NumpyProtocols):
                _refuse_partial(x, "np.vdot")
                if x.shape != first.shape:
                    raise DeinsumError(f"np.vdot: distributed shapes {a.shape} and {b.shape} differ")
        return None, _operands("np.vdot", a, b)

    _settled(first.comm, check)
    other = b if first is a else a
    if not isinstance(other, NumpyProtocols):
        other = _blocks_of(np.reshape(other, first.shape), first)
    return first.vdot(other) if first is a else np.conj(first.vdot(other))


def _norm(x, ord=None, axis=None, keepdims=False):
    """``np.linalg.norm``: the Frobenius norm of the whole array (``ord`` None, ``'fro'`` of a matrix, 2 of a
    vector), a numpy scalar of numpy's type on every rank."""
    def check():
        _refuse_partial(x, "np.linalg.norm")
        whole = axis is None or sorted(normalize_axis_tuple(axis, x.ndim)) == list(range(x.ndim))
        frobenius = ord is None or (ord == "fro" and x.ndim == 2) or (ord == 2 and x.ndim == 1)
        if not (whole and frobenius and not keepdims):
            raise DeinsumError(f"np.linalg.norm(ord={ord!r}, axis={axis!r}, keepdims={keepdims!r}) of {x!r}: "
                               f"only the norm of the whole array, Frobenius (ord None, 'fro' of a matrix) or "
                               f"the vector 2-norm, without keepdims")
        return None, {"np.linalg.norm": (repr(ord), repr(axis)), **_operands("np.linalg.norm", x)}

    _settled(x.comm, check)
    return np.linalg.norm(np.zeros(1, x.dtype)).dtype.type(x.norm())


_FUNCTIONS = {np.einsum: _einsum, np.tensordot: _tensordot, np.sum: _sum, np.trace: _trace,
              np.transpose: _transpose, np.vdot: _vdot, np.linalg.norm: _norm,
              np.shape: lambda a: a.shape, np.ndim: lambda a: a.ndim,
              np.size: lambda a, axis=None: a.size if axis is None else a.shape[axis]}


# ---- elementwise ufuncs ---------------------------------------------------------------------------------

def _elementwise(ufunc, method, inputs, kwargs):
    """``ufunc(*inputs)`` block by block in the first distributed operand's layout (plain operands: arrays,
    as numpy takes lists, or scalars)."""
    out, where = kwargs.pop("out", None), kwargs.pop("where", None)
    inputs = tuple(x if isinstance(x, NumpyProtocols) or np.ndim(x) == 0 else np.asarray(x) for x in inputs)
    lead = next(a for a in inputs + tuple(out or ()) if isinstance(a, NumpyProtocols))
    name = f"np.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}")

    def check():
        from mpi4py import MPI
        if method != "__call__":
            raise DeinsumError(f"{name} on DistributedArrays: only elementwise calls (for sums, np.sum)")
        _no_out(name, out, where=where)
        if set(kwargs) - {"dtype", "casting", "order"}:
            raise DeinsumError(f"{name}: {', '.join(sorted(kwargs))} not supported on DistributedArrays")
        for x in inputs:
            if isinstance(x, NumpyProtocols):
                _refuse_partial(x, name)
                if x.shape != lead.shape or MPI.Comm.Compare(x.comm, lead.comm) not in (MPI.IDENT, MPI.CONGRUENT):
                    raise DeinsumError(f"{name}: {lead!r} and {x!r}: distributed operands need one shape and "
                                       f"one communicator")
            elif np.ndim(x) and np.broadcast_shapes(np.shape(x), lead.shape) != lead.shape:
                raise DeinsumError(f"{name}: a plain operand of shape {np.shape(x)} does not broadcast to "
                                   f"{lead!r}'s shape {lead.shape}")
        dummies = [np.zeros(0, x.dtype) if isinstance(x, NumpyProtocols) or np.ndim(x) else x for x in inputs]
        kinds = [r.dtype for r in _outputs(ufunc(*dummies, **kwargs))]
        return kinds, _operands(name, *inputs) | {
            f"{name} options": repr(sorted(kwargs.items())), f"{name} dtypes": [k.str for k in kinds]}

    kinds = _settled(lead.comm, check)   # the layouts agreed: every rank moves the same operands
    blocks = [_block_in(x, lead) for x in inputs]
    held = lead.local is not None
    locals_ = collectively(lead.comm, lambda: _outputs(ufunc(*blocks, **kwargs)) if held else [None] * len(kinds),
                           error=DeinsumError)
    results = tuple(type(lead)(None if block is None else block.astype(kind, copy=False), kind,
                               layout=lead.layout, comm=lead.comm) for block, kind in zip(locals_, kinds))
    return results[0] if len(results) == 1 else results


def _block_in(x, lead):
    """This rank's block of operand ``x`` in ``lead``'s layout: a distributed array's (moved there if it lies
    otherwise), a plain array's (broadcast to ``lead``'s shape), or the scalar itself."""
    if isinstance(x, NumpyProtocols):
        return (x if x.layout == lead.layout else x.redistribute(lead.layout)).local
    return _blocks_of(np.broadcast_to(x, lead.shape), lead).local if np.ndim(x) else x


def _outputs(result) -> list:
    return list(result) if isinstance(result, tuple) else [result]
