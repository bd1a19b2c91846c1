"""Giving freed memory back to the operating system after a burst of connections closed.

Theory of operation.  A connection costs a few KiB of small objects; when thousands close at once
(a flood of hostile connections ends), CPython frees them, but glibc's allocator keeps the freed
pages of its heap for reuse -- the process's resident memory stays at its peak until something
asks for them back.  ``trim_memory()`` does: ``malloc_trim(0)`` returns every free page of every
glibc arena (by ``madvise``), at the cost of one walk over the heap (milliseconds for a few hundred
MiB).  The server calls it from its housekeeping tick once ``SERVER_MEMORY_TRIM_AFTER_CLOSES``
connections have closed since the last call, so a steady trickle of short connections costs a trim
now and then, and a flood's memory goes back within a tick of its end.  Where the C library has no
``malloc_trim`` (not glibc), it does nothing.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

__all__ = ["trim_memory", "trimming_available"]


def _find_malloc_trim() -> Callable[[int], int] | None:
    try:
        function = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    return function


_MALLOC_TRIM = _find_malloc_trim()


def trimming_available() -> bool:
    """Whether ``trim_memory`` can give anything back here (glibc)."""
    return _MALLOC_TRIM is not None


def trim_memory() -> bool:
    """Give the C heap's free pages back to the operating system; return whether any were."""
    if _MALLOC_TRIM is None:
        return False
    return bool(_MALLOC_TRIM(0))
