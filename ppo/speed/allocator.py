"""How the process's memory allocator treats freed memory (PPOConfig.retain_freed_memory).

Every step of a CPU run allocates and frees the same large activation tensors (on the
testbed presets, up to a few MB each). glibc's allocator hands such blocks back to the
kernel when they are freed (``munmap``, or trimming the top of the heap), so the next
step's identical allocation is a fresh mapping whose every 4 KiB page faults on first touch
and is zeroed by the kernel: up to 60,000 page faults per testbed step (mostly 20,000-50,000),
in the middle of the matrix products. Raising glibc's thresholds keeps the freed blocks in
the process for reuse instead; the faults fall to a few per step.

Nothing numerical changes: the same kernels run on the same values, only the addresses
differ. The price is resident memory: up to `TRIM_THRESHOLD` of freed memory stays mapped,
so a process's resident size stays near its peak instead of falling between steps (on the
testbed presets peak memory is about the same with and without it). The worst case is a
heap that fragments: a process that allocates and frees one large tensor over and over can
hold about twice the memory it would without. glibc only (Linux): elsewhere it does nothing, and with another allocator preloaded
(jemalloc, tcmalloc) the settings reach only glibc's, which then serves no tensors.
"""
from __future__ import annotations

import ctypes
import platform

# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 256 << 20  # blocks below this come from the heap, where freed ones are reused
TRIM_THRESHOLD = 512 << 20  # free memory at the heap's top is returned only beyond this
TOP_PAD = 64 << 20  # each heap growth asks for this much extra: fewer, larger brk calls

_retaining = False


def retain_freed_memory() -> bool:
    """Tell glibc to keep freed memory for reuse (the thresholds above); True when it took.

    Process-wide and for the rest of the process: glibc has no way back to its dynamic
    thresholds. Called once per process by `RLTrainer` when ``retain_freed_memory`` is set
    and the run is on the CPU; later calls return at once.
    """
    global _retaining
    if _retaining:
        return True
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # a libc without mallopt (musl)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    _retaining = all(mallopt(param, value) == 1 for param, value in (
        (M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD), (M_TOP_PAD, TOP_PAD)))
    return _retaining
