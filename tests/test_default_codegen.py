"""The suite compiles at LLVM ``-O0`` (``tests/conftest.py``); the library runs at
XLA's default level (3). This runs a few of the exactness tests again at the
default level, in a fresh process, so that code generation the suite does not
see (vectorisation, contracted multiply-adds) cannot break them unnoticed:
a frame translated by the total stride through a residual model gives the uncached model's output
(to float32 rounding), and the row kernel computes every dirty pixel and keeps
every clean one bit for bit.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = [
    "tests/test_deepcache.py::test_translation_by_total_stride_is_exact[direction0-resnet]",
    "tests/kernels/test_rows.py::test_schedule_by_dirty_count",
]


def test_exactness_holds_at_the_default_optimisation_level():
    env = dict(os.environ, XLA_FLAGS="--xla_backend_optimization_level=3")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    # the residual model translated one way, 9 dirty counts: all ran, none skipped
    assert re.search(r"\b10 passed\b", proc.stdout), proc.stdout[-2000:]
