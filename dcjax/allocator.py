"""Keeping XLA:CPU's freed buffers for reuse between frames (glibc's malloc).

Contract: `keep_freed_memory(nbytes)` asks the C library's allocator to keep
freed memory at the top of each heap instead of handing it back to the
operating system: all of it up to `KEEP_LIMIT` (``M_TRIM_THRESHOLD``), and
``nbytes`` when it trims beyond that (``M_TOP_PAD``, also what each growth
of a heap asks for beyond the request); and to serve blocks of every size
from the heap (``M_MMAP_MAX`` 0), so that large ones are kept too. It
returns True where it did (Linux with glibc), False elsewhere (a no-op). It
only ever raises the pad: a call with less than an earlier one changes
nothing. `run_on_calling_thread()` turns JAX's asynchronous CPU dispatch off,
so that an executable runs on the thread that calls it; JAX reads the setting
when it makes its CPU client, so it returns False (and changes nothing) once
the process has run a computation. `reserve(nbytes)` keeps ``nbytes`` of
free heap in one piece with its pages in memory, where `keep_freed_memory`
took effect, so that the heap's later growth lands on pages already there.
`page_faults()` counts the process's minor page faults so far.
`configured_pad()` is the amount the
``dcjax`` command uses: `DEFAULT_TOP_PAD`, or the
``DCJAX_MALLOC_TOP_PAD`` environment variable in bytes (0: leave the
allocator and the dispatch alone); `setting()` names what this process set.

Why: XLA:CPU allocates an executable's temporary buffers on every call, from
the heap of the thread that runs it, and frees them at the end. With glibc's
defaults the heap's top is trimmed after each call, and a block above the
mapping threshold (32 MB at most) is mapped and unmapped on its own, so the
next call faults every page in again, zero-filled by the kernel: a cached
step of MobileNetV2 at 576x768 touched 53 MB of fresh pages a frame (13,000
page faults) and, with the pad, 0.3 MB; the dense step of CenterFace at
576x768 maps one 85 MB block a call (20,806 page faults a frame), which the
pad alone cannot keep (docs/performance-notes.md, "The command keeps freed
heap memory (M_TOP_PAD)" and "The command maps no blocks and runs
executables on the calling thread"). The heap of a thread other than the
main one holds at most 64 MB (glibc's ``HEAP_MAX_SIZE``), and a block larger
than that is mapped whatever the settings; with asynchronous dispatch XLA:CPU
runs executables on a worker thread, hence `run_on_calling_thread`. The
settings are process-wide, so the library leaves them to its caller: the
``dcjax`` command makes both on start, a program that embeds dcjax may call
them itself.

A process that interleaves several programs (a benchmark) fragments its heap:
the largest temporary block (a batched dense step's) at times finds no hole
large enough, and the heap grows by that much, its zero-filled pages faulted
in during that call. `reserve` makes that growth fault-free by faulting the
pages in beforehand; `dcjax.eval.interleaving` calls it at the end of each
warm-up (docs/performance-notes.md, "The heap's growth is faulted in before
the timed frames").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform

from dcjax._compat import backends_made

__all__ = [
    "DEFAULT_TOP_PAD",
    "KEEP_LIMIT",
    "PAD_ENV",
    "RESERVE",
    "configured_pad",
    "keep_freed_memory",
    "page_faults",
    "reserve",
    "run_on_calling_thread",
    "setting",
]

#: The pad the ``dcjax`` command asks for (bytes). Measured on MobileNetV2 at
#: 576x768, whose cached step frees and requests about 54 MB a frame: 32 MB left
#: every page fault in place, 64 MB removed them in one run of three, 128 and
#: 256 MB in every run (docs/performance-notes.md).
DEFAULT_TOP_PAD = 256 << 20

#: Freed memory at the top of a heap kept whatever the pad (bytes: the largest
#: value ``mallopt`` takes). Temporaries grow with the batch: four streams of
#: MobileNetV2 at 576x768 free about 340 MB a call, which a 256 MB limit trimmed
#: and faulted in again on every call (docs/performance-notes.md).
KEEP_LIMIT = 2**31 - 1

#: Heap memory `reserve` faults in by default (bytes): more than the heap of a
#: streams benchmark grew by after its warm-up (823 MB for eight ResNet-50
#: streams at 224x224, five methods interleaved; docs/performance-notes.md).
RESERVE = 1 << 30

#: Environment variable overriding `DEFAULT_TOP_PAD` for the command (bytes; 0: off).
PAD_ENV = "DCJAX_MALLOC_TOP_PAD"

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers
_M_TOP_PAD = -2
_M_MMAP_MAX = -4
_set = {"pad": 0, "heap_only": False, "sync": False}


@functools.cache
def _libc():
    """glibc's ``mallopt``, or None where the C library is not glibc."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return _glibc().mallopt
    except (OSError, AttributeError):
        return None


@functools.cache
def _glibc() -> ctypes.CDLL:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    return libc


def _check_bytes(what: str, nbytes: object) -> None:
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"dcjax: {what} must be a number of bytes >= 0, got {nbytes!r}")


def keep_freed_memory(nbytes: int = DEFAULT_TOP_PAD) -> bool:
    """Keep freed heap memory for reuse, ``nbytes`` of it when trimming (module docstring)."""
    _check_bytes("the pad", nbytes)
    mallopt = _libc()
    if mallopt is None:
        return False
    if nbytes <= _set["pad"]:
        return True
    if not _set["heap_only"]:
        if mallopt(_M_MMAP_MAX, 0) != 1 or mallopt(_M_TRIM_THRESHOLD, KEEP_LIMIT) != 1:
            return False
        _set["heap_only"] = True
    # mallopt takes an int: clamp to its range
    if mallopt(_M_TOP_PAD, min(nbytes, 2**31 - 1)) != 1:
        return False
    _set["pad"] = nbytes
    return True


def reserve(nbytes: int = RESERVE) -> bool:
    """Allocate ``nbytes`` of heap in one block, write it and free it, so that
    the heap holds that much free memory in one piece with its pages in memory
    (module docstring): a block that later finds no other hole lands there
    without a page fault. Only where `keep_freed_memory` took effect, which
    keeps the freed block: False elsewhere, and nothing is touched. Each call
    writes the whole block again (a memory pass where its pages are in
    already), so a process that grew its heap since faults in a fresh
    reserve.

    Raises:
        ValueError: ``nbytes`` negative, or so large that the heap's top would
            pass `KEEP_LIMIT` with the pad, and be trimmed.
    """
    _check_bytes("a reserve", nbytes)
    if nbytes + _set["pad"] >= KEEP_LIMIT:
        raise ValueError(
            f"dcjax: a reserve of {nbytes} bytes and the pad of {_set['pad']} pass the "
            f"trim limit of {KEEP_LIMIT}: ask for less"
        )
    if not _set["heap_only"]:
        return False
    libc = _glibc()
    block = libc.malloc(nbytes)
    if not block:
        return False
    ctypes.memset(block, 0, nbytes)  # each page written: faulted in
    libc.free(block)
    return True


def page_faults() -> int:
    """The minor page faults of this process so far (``getrusage``)."""
    import resource  # Unix only

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def run_on_calling_thread() -> bool:
    """Run XLA:CPU executables on the thread that calls them, whose heap is not
    capped (JAX's ``jax_cpu_enable_async_dispatch`` off; module docstring): a
    call returns when its outputs are ready. True where it took effect; False
    where JAX had made its backends already (the setting is read then)."""
    import jax

    if backends_made():
        return _set["sync"]
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    _set["sync"] = True
    return True


def setting() -> str:
    """What this process set, a condition of every timing it makes on CPU:
    the pad, whether large blocks come from the heap, and whether executables
    run on the calling thread, e.g. ``"heap pad 256 MiB, no mapped blocks,
    trimmed above 2047 MiB, sync dispatch"``."""
    parts = [f"heap pad {_set['pad'] >> 20} MiB"]
    if _set["heap_only"]:
        parts.append(f"no mapped blocks, trimmed above {KEEP_LIMIT >> 20} MiB")
    if _set["sync"]:
        parts.append("sync dispatch")
    return ", ".join(parts)


def configured_pad() -> int:
    """The pad the command uses: ``DCJAX_MALLOC_TOP_PAD`` if set, else `DEFAULT_TOP_PAD`."""
    text = os.environ.get(PAD_ENV)
    if text is None or not text.strip():
        return DEFAULT_TOP_PAD
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"dcjax: {PAD_ENV} must be a number of bytes >= 0, got {text!r}")
    return value
