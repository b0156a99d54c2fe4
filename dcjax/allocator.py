"""Keeping freed heap memory for reuse between frames (glibc's ``M_TOP_PAD``).

Contract: `keep_freed_memory(nbytes)` asks the C library's allocator to keep
up to ``nbytes`` of freed memory at the top of each heap instead of handing it
back to the operating system, and returns True where it did (Linux with
glibc), False elsewhere (a no-op). It only ever raises the amount: a call with
less than an earlier one changes nothing. `configured_pad()` is the amount the
``dcjax`` command uses: `DEFAULT_TOP_PAD`, or the ``DCJAX_MALLOC_TOP_PAD``
environment variable in bytes (0: leave the allocator alone).

Why: XLA:CPU allocates an executable's temporary buffers on every call, from
the heap of the thread that runs it, and frees them at the end. With glibc's
defaults the heap's top is trimmed after each call, so the next call faults
every page in again, zero-filled by the kernel: a cached step of MobileNetV2
at 576x768 touched 53 MB of fresh pages a frame (13,000 page faults) and,
with the pad, 0.3 MB (docs/performance-notes.md, "The command keeps freed
heap memory (M_TOP_PAD)"). The setting is process-wide, so the library leaves
it to its caller: the ``dcjax`` command sets it on start, a program that
embeds dcjax may call `keep_freed_memory` itself.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform

__all__ = ["DEFAULT_TOP_PAD", "PAD_ENV", "configured_pad", "current_pad", "keep_freed_memory"]

#: The pad the ``dcjax`` command asks for (bytes). Measured on MobileNetV2 at
#: 576x768, whose cached step frees and requests about 54 MB a frame: 32 MB left
#: every page fault in place, 64 MB removed them in one run of three, 128 and
#: 256 MB in every run (docs/performance-notes.md).
DEFAULT_TOP_PAD = 256 << 20

#: Environment variable overriding `DEFAULT_TOP_PAD` for the command (bytes; 0: off).
PAD_ENV = "DCJAX_MALLOC_TOP_PAD"

_M_TOP_PAD = -2  # glibc's mallopt parameter number
_set = {"pad": 0}


@functools.cache
def _libc():
    """glibc's ``mallopt``, or None where the C library is not glibc."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.mallopt
    except (OSError, AttributeError):
        return None


def keep_freed_memory(nbytes: int = DEFAULT_TOP_PAD) -> bool:
    """Keep up to ``nbytes`` of freed memory per heap for reuse (module docstring)."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"dcjax: the pad must be a number of bytes >= 0, got {nbytes!r}")
    mallopt = _libc()
    if mallopt is None:
        return False
    if nbytes <= _set["pad"]:
        return True
    # mallopt takes an int: clamp to its range
    if mallopt(_M_TOP_PAD, min(nbytes, 2**31 - 1)) != 1:
        return False
    _set["pad"] = nbytes
    return True


def current_pad() -> int:
    """The pad this process has set (bytes; 0 where `keep_freed_memory` never
    raised it): a condition of every timing the process makes on CPU."""
    return _set["pad"]


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
