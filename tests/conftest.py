"""Settings for the whole suite.

The tests run small shapes, where compiling dominates running:

- XLA's CPU backend compiles them with LLVM at ``-O0``
  (``--xla_backend_optimization_level=0``), which cut the suite's wall time by
  about a third on a 2-core machine; and its fusions are emitted by the
  elemental emitter instead of the MLIR fusion emitters
  (``--xla_cpu_use_fusion_emitters=false``), which cut it by another third
  (docs/performance-notes.md, "The MLIR fusion emitters: kept for the
  library, off for the tests"). XLA's own HLO passes
  (fusion, layout, simplification) still run, so every test sees the
  computation the library builds; only the machine code differs. Benchmarks
  and the demo run with XLA's defaults, and ``tests/test_default_codegen.py``
  runs a few exactness tests again with them. Setting ``XLA_FLAGS`` with a
  level of one's own keeps XLA's defaults for both.
- JAX's persistent compilation cache is off (``JAX_ENABLE_COMPILATION_CACHE=
  false``, unless set): with it shared by the xdist workers, a worker died of
  a segmentation fault inside it twice (2026-11-28: once loading a cached
  executable, `compilation_cache.get_executable_and_time`, in
  tests/test_random_programs.py; once on CI compiling and writing one). It
  saved about a minute of the suite.
- ``kernel="auto"`` takes the fixed rules (``DCJAX_TUNING=prior``): measuring
  every layer's kernels on each transform would cost more than most tests,
  and a choice by timing would differ from run to run. The tests of the
  measured tuning (tests/test_autotune.py, tests/kernels/test_tuning.py) ask
  for it, with measurements kept in a file of their own.
"""

import os

_FLAG = "--xla_backend_optimization_level"
_QUICK = f"{_FLAG}=0 --xla_cpu_use_fusion_emitters=false"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_QUICK}".strip()

os.environ.setdefault("JAX_ENABLE_COMPILATION_CACHE", "false")
os.environ.setdefault("DCJAX_TUNING", "prior")
