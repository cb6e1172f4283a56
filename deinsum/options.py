"""The checks of options users pass (casting, dtypes, ranks, named choices): one-line DeinsumErrors."""
import numpy as np

from .errors import DeinsumError


#: numpy's casting rules, as ``numpy.can_cast`` names them.
CASTINGS = ("no", "equiv", "safe", "same_kind", "unsafe")


def check_choice(option: str, value, choices) -> None:
    """Raise a DeinsumError naming ``option`` unless ``value`` is one of ``choices``.

    >>> check_choice("result", "bogus", ("all", "root", "distributed"))
    Traceback (most recent call last):
    ...
    deinsum.errors.DeinsumError: result='bogus': expected one of all, root, distributed
    """
    if not any(value is c or (isinstance(value, str) and value == c) for c in choices):
        raise DeinsumError(f"{option}={value!r}: expected one of {', '.join(map(str, choices))}")


def as_dtype(value, what: str = "dtype") -> np.dtype:
    """``np.dtype(value)`` for the integer, float and complex types deinsum computes in, else a DeinsumError
    (``what`` names it). Not bool: ``numpy.einsum`` of bools is a logical OR of ANDs, which deinsum does not do.

    >>> as_dtype(bool, "from_global: dtype")
    Traceback (most recent call last):
    ...
    deinsum.errors.DeinsumError: from_global: dtype bool: expected an integer, float or complex type
    """
    try:
        dtype = np.dtype(value)
    except TypeError:
        raise DeinsumError(f"{what} {value!r} is not a numpy data type") from None
    if dtype.kind not in "iufc":
        raise DeinsumError(f"{what} {dtype.name}: expected an integer, float or complex type")
    return dtype


#: The most ranks deinsum plans for: the volume model keeps a few integers per rank (2**24 ranks: 128 MiB each).
MAX_RANKS = 2**24


def as_ranks(value, what: str = "nprocs") -> int:
    """``value`` as a number of ranks (an integer from 1 to :data:`MAX_RANKS`, numpy's included), else a
    DeinsumError naming ``what``: the one check of every entry point's ``nprocs`` (and ``-P``, ``-n``).

    >>> as_ranks(np.int64(4))
    4
    >>> as_ranks(2.5)
    Traceback (most recent call last):
    ...
    deinsum.errors.DeinsumError: nprocs=2.5: expected a number of ranks, an integer from 1 to 16,777,216
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= MAX_RANKS:
        shown = int(value) if isinstance(value, np.integer) else repr(value)
        raise DeinsumError(f"{what}={shown}: expected a number of ranks, an integer from 1 to {MAX_RANKS:,}")
    return int(value)
