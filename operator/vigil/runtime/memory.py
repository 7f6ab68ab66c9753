"""Memory freed by a transient peak goes back to the system.

A list's pages are parsed and trimmed one at a time (kube.client.list_all), so what the operator
keeps of a collection is bounded by what it keeps per object; but glibc's allocator holds on to
the heap a page's parse grew into, so without this a restart that listed a tenant's large pods
stays that much larger for ever (e2e/test_hostile_pods.py). `malloc_trim(0)` after a list
returns the free heap; elsewhere than glibc it is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable


def _malloc_trim() -> Callable[[], None]:
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to give back this way
        trim = None
    if trim is None:
        return lambda: None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


give_back: Callable[[], None] = _malloc_trim()
