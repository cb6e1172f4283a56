"""Memory per rank, in bytes: the machine's free memory, the one default, and sizes like ``4GiB``.

Every ``memory`` deinsum takes or prints (``compile``, ``plan --memory``, an emitted
script's ``--memory``, the JSON) is the peak a rank may use, in bytes, its own blocks of
the inputs and result included.

STANDALONE: standard library only (emitted scripts carry it in their runtime block; the pure
planner imports it without MPI).

>>> available_memory() > 0
True
>>> as_bytes("1.5 GiB"), as_bytes("500MB"), as_bytes(4096)
(1610612736, 500000000, 4096)
"""
import math
import os
import re

#: Unit suffixes of :func:`as_bytes` (case-insensitive; ``B`` alone or none: bytes).
UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "k": 2**10, "kib": 2**10, "m": 2**20, "mib": 2**20, "g": 2**30, "gib": 2**30, "t": 2**40, "tib": 2**40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)(?:[eE]\+?(\d+))?\s*([A-Za-z]*)\s*")


def available_memory():
    """Bytes free on this node: ``MemAvailable`` of ``/proc/meminfo``, else the physical memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_memory(ranks_on_node):
    """Bytes one of ``ranks_on_node`` ranks sharing this node may use: :func:`available_memory` divided
    among them (the default of every entry point; a plan made without ranks assumes ``min(P, cores)``).

    >>> default_memory(2) <= available_memory()
    True
    """
    return max(1, available_memory() // max(1, int(ranks_on_node)))


def as_bytes(value, what="memory", error=ValueError):
    """``value`` (an integer, or text with a unit: ``4GiB``, ``500MB``, ``1e9``) as bytes >= 1, else
    ``error`` naming ``what``.

    >>> as_bytes("2 k"), as_bytes("1e6")
    (2048, 1000000)
    >>> as_bytes("-5")
    Traceback (most recent call last):
    ...
    ValueError: memory='-5': expected bytes >= 1, as an integer or with a unit (4GiB, 500MB)
    """
    number = None
    if isinstance(value, str):
        match = _SIZE.fullmatch(value)
        if match is not None and match.group(3).lower() in UNITS:
            number = float(match.group(1)) * 10 ** int(match.group(2) or 0) * UNITS[match.group(3).lower()]
    elif hasattr(value, "__index__") and not isinstance(value, bool):
        number = value.__index__()
    if number is None or not (isinstance(number, int) or math.isfinite(number)) or number < 1:
        raise error(f"{what}={value!r}: expected bytes >= 1, as an integer or with a unit (4GiB, 500MB)")
    return int(number)
