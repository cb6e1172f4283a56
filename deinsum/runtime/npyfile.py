"""One ``.npy`` file read by one process: its header, checked (format 1, 2 or 3; C or Fortran order; either
byte order; numbers only), and the whole array.

STANDALONE: numpy and the sibling runtime modules (emitted scripts carry it). Functions that raise take
the exception class to raise (``error``): one line naming the file and what is wrong with it.

>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "x.npy")
>>> np.save(path, np.asfortranarray(np.ones((2, 3), ">f4")))
>>> read_header(path)
Header(shape=(2, 3), dtype=dtype('>f4'), fortran=True, offset=128)
>>> load_npy(path, (2, 4), np.float64)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: input ...x.npy: expected shape (2, 4), not (2, 3)
"""
import os
from typing import NamedTuple

import numpy as np
from numpy.lib import format as npformat

from .checks import check_cast


class Header(NamedTuple):
    """What a ``.npy`` header says: the array's shape, its dtype as stored, whether it is in Fortran
    order, and where its data start."""

    shape: tuple
    dtype: np.dtype
    fortran: bool
    offset: int


def read_header(path, what="input", error=ValueError):
    """The :class:`Header` of the ``.npy`` file ``path`` (this process alone), or a one-line ``error``: a
    missing, empty or truncated file, no ``.npy`` (an ``.npz`` too), Python objects, non-numeric data."""
    if os.path.isdir(path):
        raise error(f"{what} {path}: a directory, not a .npy file")
    if not os.path.isfile(path):
        raise error(f"{what} {path}: no such file" if not os.path.exists(path) else f"{what} {path}: not a regular file")
    size = os.path.getsize(path)
    if size == 0:
        raise error(f"{what} {path}: the file is empty")
    with open(path, "rb") as f:
        if f.read(4) == b"PK\x03\x04":
            raise error(f"{what} {path}: expected one array in a .npy file, not an .npz archive")
        f.seek(0)
        try:
            version = npformat.read_magic(f)
            if version not in ((1, 0), (2, 0), (3, 0)):
                raise ValueError(f"format version {version[0]}.{version[1]}, expected 1.0, 2.0 or 3.0")
            # 3.0 differs from 2.0 only in the header's encoding (UTF-8): the same for a numeric dtype
            read = npformat.read_array_header_1_0 if version == (1, 0) else npformat.read_array_header_2_0
            shape, fortran, dtype = read(f)
        except Exception as exc:  # noqa: BLE001 - numpy raises many types for bad files
            raise error(f"{what} {path}: not a readable .npy file ({' '.join(str(exc).split())})") from None
        offset = f.tell()
    if dtype.hasobject:
        raise error(f"{what} {path}: holds Python objects (a pickled array), which is never loaded")
    if dtype.kind not in "biufc":
        raise error(f"{what} {path}: non-numeric data of dtype {dtype}")
    data = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if size < offset + data:
        raise error(f"{what} {path}: truncated: {size - offset:,} bytes of data, expected {data:,}")
    return Header(tuple(shape), dtype, fortran, offset)


def expect(head, shape, dtype, casting, where, error=ValueError):
    """Raise a one-line ``error`` unless the file of ``head`` holds ``shape`` in a dtype that numpy's ``casting``
    rule turns into ``dtype``."""
    if head.shape != tuple(shape):
        raise error(f"{where}: expected shape {tuple(shape)}, not {head.shape}")
    check_cast(head.dtype, dtype, casting, where, error)


def load_npy(path, shape, dtype, casting="safe", what="input", error=ValueError):
    """The whole array in the ``.npy`` file ``path`` as ``dtype`` (this process alone), or a one-line ``error``:
    those of :func:`read_header` and :func:`expect`."""
    expect(read_header(path, what, error), shape, dtype, casting, f"{what} {path}", error)
    return np.load(path, allow_pickle=False).astype(dtype, copy=False)
