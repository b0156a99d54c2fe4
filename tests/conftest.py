"""Settings for the whole suite.

The tests run small shapes, where compiling dominates running: XLA's CPU
backend compiles them with LLVM at ``-O0`` (``--xla_backend_optimization_level=0``),
which cut the suite's wall time by about a third on a 2-core machine. XLA's
own HLO passes (fusion, layout, simplification) still run, so every test sees
the computation the library builds; only the machine code is less optimised.
Benchmarks and the demo run at the default level, and
``tests/test_default_codegen.py`` runs a few exactness tests again there.
Setting ``XLA_FLAGS`` with a level of one's own keeps it.
"""

import os

_FLAG = "--xla_backend_optimization_level"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}=0".strip()
