"""`dcjax.allocator`: freed heap memory kept for reuse, and the command's setting."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from dcjax import allocator
from dcjax.cli import app

glibc = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="M_TOP_PAD is glibc's; elsewhere keep_freed_memory is a no-op (returns False)",
)

# A worker thread allocates eight 6 MB blocks, writes them, frees them, ten
# times (what XLA:CPU does with an executable's temporaries on each call);
# prints the page faults of the last nine rounds.
_CHURN = """
import ctypes, resource, sys, threading
from dcjax import allocator
if sys.argv[1] == "pad":
    assert allocator.keep_freed_memory(256 << 20)
libc = allocator._glibc()  # malloc and free declared
faults = []
def work():
    for i in range(10):
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        blocks = [libc.malloc(6 << 20) for _ in range(8)]
        for b in blocks:
            ctypes.memset(b, 1, 6 << 20)
        for b in blocks:
            libc.free(b)
        if i:
            faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
t = threading.Thread(target=work)
t.start()
t.join()
print(sum(faults))
"""


def _faults(mode: str) -> int:
    proc = subprocess.run([sys.executable, "-c", _CHURN, mode], capture_output=True, text=True,
                          timeout=120, check=True)  # fmt: skip
    return int(proc.stdout.split()[-1])


@glibc
def test_a_pad_keeps_freed_blocks_for_the_next_round():
    without, with_pad = _faults("none"), _faults("pad")
    # 9 rounds of 48 MB: about 110,000 pages faulted in again without the pad
    assert without > 50_000, without
    assert with_pad < without / 20, (with_pad, without)


# An executable whose one temporary (sin(x), 96 MB) is larger than a worker
# thread's heap can hold (64 MB): prints the page faults of each of 8 calls
# after 3.
_LARGE_TEMPORARY = """
import resource, sys
from dcjax import allocator
if sys.argv[1] == "command":  # with a pad smaller than the temporary
    assert allocator.keep_freed_memory(16 << 20)
    allocator.run_on_calling_thread()
import jax, jax.numpy as jnp
f = jax.jit(lambda x, w: jnp.sin(x) @ w)
x, w = jnp.ones((6144, 4096)), jnp.ones((4096, 4))
for _ in range(3):
    jax.block_until_ready(f(x, w))
faults = []
for _ in range(8):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    jax.block_until_ready(f(x, w))
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(*faults)
"""


@glibc
def test_the_command_keeps_temporaries_larger_than_a_thread_heap():
    """What the dense step of a model at the camera's resolution allocates: with
    the pad alone the block is mapped afresh on every call; with the command's
    settings (large blocks from the heap, kept beyond the pad, executables on
    the calling thread) it is kept."""

    def faults(mode):
        proc = subprocess.run([sys.executable, "-c", _LARGE_TEMPORARY, mode],
                              capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
        return sorted(int(n) for n in proc.stdout.split()[-8:])

    without, command = faults("none"), faults("command")
    assert without[0] > 20_000, without  # every call: 24,576 pages of 4 KB
    # a call may find the block's place taken by smaller allocations and fault a
    # fresh one in (one or two calls of 8 in some runs); most fault nothing
    assert command[4] < 1_000 and sum(command) < sum(without) / 3, (command, without)


# Six blocks of 32 MB allocated, written and kept, so that the heap grows by
# each (what it does where a fragmented heap has no hole for a block); prints
# whether a reserve of 256 MB took effect first, and the page faults of the
# six blocks.
_GROWTH = """
import ctypes, resource, sys
from dcjax import allocator
if sys.argv[1] != "default":
    assert allocator.keep_freed_memory(16 << 20)
took = allocator.reserve(256 << 20) if sys.argv[1] != "pad" else None
libc = allocator._glibc()  # malloc and free declared
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
kept = []
for i in range(6):
    block = libc.malloc(32 << 20)
    ctypes.memset(block, 1, 32 << 20)
    kept.append(block)
print(took, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@glibc
def test_a_reserve_faults_the_heaps_growth_in_beforehand():
    def run(mode):
        proc = subprocess.run([sys.executable, "-c", _GROWTH, mode], capture_output=True,
                              text=True, timeout=120, check=True)  # fmt: skip
        took, faults = proc.stdout.split()[-2:]
        return took, int(faults)

    assert run("default")[0] == "False"  # nothing kept: no reserve
    _, without = run("pad")
    took, with_reserve = run("reserve")
    assert without > 40_000, without  # 192 MB grown: 49,152 pages of 4 KB
    assert took == "True" and with_reserve < without / 20, (with_reserve, without)


@glibc
def test_bad_reserves_are_errors():
    with pytest.raises(ValueError, match="number of bytes"):
        allocator.reserve(-1)
    with pytest.raises(ValueError, match="trim limit"):
        allocator.reserve(allocator.KEEP_LIMIT)


def test_the_dispatch_setting_takes_effect_only_before_the_backends():
    """JAX reads it when it makes its CPU client: in a fresh process it takes
    effect, in one that has computed it does not (and says so)."""
    code = (
        "import sys, jax, jax.numpy as jnp\n"
        "from dcjax import allocator\n"
        "if sys.argv[1] == 'late':\n"
        "    jnp.ones(2).block_until_ready()\n"
        "took = allocator.run_on_calling_thread()\n"
        "print(took, 'sync dispatch' in allocator.setting())\n"
    )
    runs = {when: subprocess.run([sys.executable, "-c", code, when], capture_output=True, text=True,
                                 timeout=120, check=True).stdout.split()
            for when in ("early", "late")}  # fmt: skip
    assert runs == {"early": ["True", "True"], "late": ["False", "False"]}


@glibc
def test_the_pad_only_grows():
    assert allocator.keep_freed_memory(1 << 20)
    assert allocator.keep_freed_memory(0)  # less than before: nothing changes, still kept


def test_bad_pads_are_errors(monkeypatch, capsys):
    with pytest.raises(ValueError, match="number of bytes"):
        allocator.keep_freed_memory(-1)
    with pytest.raises(ValueError, match="number of bytes"):
        allocator.keep_freed_memory(1.5)  # type: ignore[arg-type]
    monkeypatch.setenv(allocator.PAD_ENV, "lots")
    assert app.main(["models"]) == 2
    assert f"{allocator.PAD_ENV} must be a number of bytes" in capsys.readouterr().err


def test_the_command_sets_the_configured_pad(monkeypatch):
    asked, synced = [], []
    monkeypatch.setattr(allocator, "keep_freed_memory", lambda n: asked.append(n) or True)
    monkeypatch.setattr(allocator, "run_on_calling_thread", lambda: synced.append(len(asked)))
    monkeypatch.delenv(allocator.PAD_ENV, raising=False)
    assert app.main(["models"]) == 0
    monkeypatch.setenv(allocator.PAD_ENV, "1048576")
    assert app.main(["models"]) == 0
    monkeypatch.setenv(allocator.PAD_ENV, "0")  # off: the allocator and the dispatch are left alone
    assert app.main(["models"]) == 0
    assert asked == [allocator.DEFAULT_TOP_PAD, 1 << 20]
    assert synced == [1, 2]
