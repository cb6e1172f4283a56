"""How much memory this machine has free: the one reading the planner and emitted scripts share.

STANDALONE: standard library only (emitted scripts carry it in their runtime block; the pure
planner imports it without MPI).

>>> available_memory() > 0
True
"""
import os


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
