"""Settings for the whole suite.

The tests run small shapes, where compiling dominates running:

- XLA's CPU backend compiles them with LLVM at ``-O0``
  (``--xla_backend_optimization_level=0``), which cut the suite's wall time by
  about a third on a 2-core machine. XLA's own HLO passes (fusion, layout,
  simplification) still run, so every test sees the computation the library
  builds; only the machine code is less optimised. Benchmarks and the demo run
  at the default level, and ``tests/test_default_codegen.py`` runs a few
  exactness tests again there. Setting ``XLA_FLAGS`` with a level of one's own
  keeps it.
- JAX's persistent compilation cache is on, in a directory of this run's own
  (shared by the xdist workers and the subprocesses the tests start, removed
  at the end): many tests compile the same programs (a model's no-cache step,
  a method the CLI tests run again), and a program compiled once is loaded
  from the cache afterwards. On the 2-core development machine it took
  ``tests/eval`` and the command-line tests (now ``tests/cli``) from 136 to 84 s. The cache's key
  covers the program, the XLA flags and the jax version, so a test that
  changes any of them compiles afresh. Setting ``JAX_COMPILATION_CACHE_DIR``
  oneself keeps one's own directory (and it is not removed).
- ``kernel="auto"`` takes the fixed rules (``DCJAX_TUNING=prior``): measuring
  every layer's kernels on each transform would cost more than most tests,
  and a choice by timing would differ from run to run. The tests of the
  measured tuning (tests/test_autotune.py, tests/kernels/test_tuning.py) ask
  for it, with measurements kept in a file of their own.
"""

import atexit
import os
import shutil
import tempfile

_FLAG = "--xla_backend_optimization_level"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}=0".strip()

if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    # Set before the xdist workers start, which inherit it (with the settings
    # below): the process that made the directory removes it when it exits.
    _cache = tempfile.mkdtemp(prefix="dcjax-tests-xla-cache-")
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

os.environ.setdefault("DCJAX_TUNING", "prior")
