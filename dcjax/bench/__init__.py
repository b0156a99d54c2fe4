"""Benchmark programs: ``dcjax bench PROGRAM ...``.

Each program is a module here with ``main(argv) -> int`` (its own options,
``dcjax bench PROGRAM --help``), and writes its results as JSON under
``bench-results/`` by default:

- `dcjax.bench.kernels`: the sparse convolution kernels against the dense
  convolution, by dirty fraction;
- `dcjax.bench.matvec`: the fully connected row update against the dense
  product, by fraction of changed inputs;
- `dcjax.bench.reanchor`: the float32 drift of fully connected layers updated
  by rows over a long stream, by re-anchoring period;
- `dcjax.bench.matchers`: the block matchers' frames per second and match ratio;
- `dcjax.bench.zoo`: the model zoo's parameters, FLOPs, dense latency and
  cache memory;
- `dcjax.bench.semantic`: semantic early exits (tau sweep, exit rates, exit ceiling);
- `dcjax.bench.ceiling`: ideal speedup against fidelity with every reuse taken;
- `dcjax.bench.floor`: what a cached step costs where almost nothing changes,
  and the speedup over the dense step no clip can pass on this machine;
- `dcjax.bench.streams`: many streams at once (`dcjax.streams`): throughput,
  mean and p99 times and speedups by number of streams;
- `dcjax.bench.layers`: the layer cache across models (`dcjax.layercache`):
  load and run modes against the number of similar networks, memory limits
  and cold or warm storage.

``dcjax bench`` without a program is the paper's evaluation
(`dcjax.bench.evaluation`). The helpers the programs and the command share
are `dcjax.bench.arguments` (argument types and checks) and
`dcjax.bench.common` (models and frames, tables, JSON, timing, warnings).
Importing this package imports none of the programs.
"""

__all__ = ["PROGRAMS"]

#: Program name (a module of this package) -> what it measures.
PROGRAMS: dict[str, str] = {
    "kernels": "sparse convolution kernels against dense, by dirty fraction",
    "matvec": "fully connected row updates against dense, by changed fraction",
    "reanchor": "float32 drift of row-updated fully connected layers, by re-anchoring period",
    "matchers": "block matchers: frames/s and match ratio",
    "zoo": "the model zoo: parameters, FLOPs, latency, cache memory",
    "semantic": "semantic exits: tau sweep, exit rates, exit ceiling",
    "ceiling": "ideal speedup against fidelity with every reuse taken",
    "floor": "a cached step's cost where almost nothing changes: the speedup no clip passes",
    "streams": "many streams at once: throughput, mean and p99 by number of streams",
    "layers": "the layer cache across models: load and run modes, similar networks, memory",
}
