"""Model-zoo benchmark: size, FLOPs, dense latency and conv-cache memory per model.

Run ``dcjax bench zoo`` (``--help`` for options). For every zoo model at
its published input size and batch 1 it reports:

* ``params``: parameter count (BatchNorm running statistics excluded);
* ``convs``: number of convolutions (DeepCache Table 3 lists 5, 57, 53, 8, 5 for
  AlexNet, GoogLeNet, ResNet-50, YOLO and Dave);
* ``conv_gflops`` / ``total_gflops``: FLOPs counted on the jaxpr (a multiply-add is
  2 FLOPs; convolutions and dense layers exactly, pooling as window size per output,
  other elementwise ops and reductions as one per output element; reshapes,
  broadcasts and concatenations are free);
* ``conv_share``: conv FLOPs / total FLOPs, next to the conv share of *time* in
  DeepCache's Table 1 (TensorFlow on a Nexus 6) where the paper has the model;
* ``latency_ms``: median wall time of the dense, uncached ``jax.jit`` forward pass
  on this machine's default JAX device, after warm-up;
* ``cache_mb``: float32 bytes of one full cache of every convolution's output, the
  memory DeepCache's reuse needs (the paper reports 2.5-43.8 MB, Figure 18).

The models are random-initialised (timings and sizes do not depend on the weights).
The table is printed and the numbers are written as JSON (default
``bench-results/models.json``). This is a command, not a test.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend import core

from dcjax import models
from dcjax.bench.arguments import at_least, nonnegative_int, program_parser
from dcjax.bench.common import Timed, machine, table, time_interleaved, write_json
from dcjax.transforms.host_syncs import sub_jaxprs

__all__ = ["JaxprCost", "count_cost", "main", "measure"]

# DeepCache Table 1, conv share of processing time with TensorFlow on a Nexus 6.
PAPER_CONV_TIME_SHARE = {
    "alexnet": 0.792,
    "googlenet": 0.802,
    "resnet50": 0.918,
    "yolo_tiny": 0.824,
    "dave": 0.588,
}
# DeepCache Table 3, number of convolutions.
PAPER_CONVS = {"alexnet": 5, "googlenet": 57, "resnet50": 53, "yolo_tiny": 8, "dave": 5}

_FREE = {
    "reshape",
    "broadcast_in_dim",
    "concatenate",
    "convert_element_type",
    "squeeze",
    "expand_dims",
    "transpose",
    "slice",
    "pad",
    "copy",
}


class JaxprCost:
    """FLOPs and conv output sizes accumulated over a jaxpr (see `count_cost`)."""

    def __init__(self) -> None:
        self.conv_flops = 0
        self.dense_flops = 0
        self.other_flops = 0
        self.convs = 0
        self.conv_out_bytes = 0

    @property
    def total_flops(self) -> int:
        """All counted FLOPs."""
        return self.conv_flops + self.dense_flops + self.other_flops


def _size(aval: Any) -> int:
    return math.prod(getattr(aval, "shape", ()))


def count_cost(jaxpr: core.Jaxpr, cost: JaxprCost | None = None) -> JaxprCost:
    """Counts FLOPs per kind and conv output bytes of ``jaxpr`` (sub-jaxprs included).

    Args:
        jaxpr: e.g. ``jax.make_jaxpr(module.apply)(variables, x).jaxpr``.
        cost: accumulator to add to (a new one by default).

    Returns:
        The accumulated `JaxprCost`.
    """
    cost = JaxprCost() if cost is None else cost
    for eqn in jaxpr.eqns:
        subs = sub_jaxprs(eqn.params)
        if subs:
            for sub in subs:
                count_cost(sub, cost)
            continue
        name = eqn.primitive.name
        outs = sum(_size(v.aval) for v in eqn.outvars)
        if name == "conv_general_dilated":
            rhs = eqn.invars[1].aval
            rhs_spec = eqn.params["dimension_numbers"].rhs_spec
            per_output = rhs.shape[rhs_spec[1]] * math.prod(rhs.shape[d] for d in rhs_spec[2:])
            cost.conv_flops += 2 * outs * per_output
            cost.convs += 1
            out = eqn.outvars[0].aval
            cost.conv_out_bytes += _size(out) * jnp.dtype(out.dtype).itemsize
        elif name == "dot_general":
            (lhs_contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval
            cost.dense_flops += 2 * outs * math.prod(lhs.shape[d] for d in lhs_contract)
        elif name.startswith("reduce_window"):
            cost.other_flops += outs * math.prod(eqn.params["window_dimensions"])
        elif name.startswith("reduce_"):
            cost.other_flops += sum(_size(v.aval) for v in eqn.invars)
        elif name not in _FREE:
            cost.other_flops += outs
    return cost


def measure(
    name: str, *, repeats: int = 10, warmup: int = 2, latency: bool = True
) -> dict[str, Any]:
    """Benchmarks one zoo model at its published input size, batch 1.

    Args:
        name: a `dcjax.models.names()` entry.
        repeats: timed runs (the median is reported).
        warmup: untimed runs after compilation.
        latency: time the forward pass (otherwise only static numbers).

    Returns:
        A JSON-serialisable dict of the numbers described in the module docstring.
    """
    spec = models.info(name)
    h, w, c = spec.input_shape
    module, variables = models.create(name)
    x = jnp.asarray(
        models.preprocess(
            name, jax.random.randint(jax.random.PRNGKey(0), (1, h, w, c), 0, 256, jnp.int32)
        )
    )
    cost = count_cost(jax.make_jaxpr(module.apply)(variables, x).jaxpr)
    params = sum(leaf.size for leaf in jax.tree_util.tree_leaves(variables["params"]))
    row: dict[str, Any] = {
        "model": name,
        "input_shape": [h, w, c],
        "params": int(params),
        "published_params": spec.published_params,
        "convs": cost.convs,
        "paper_convs": PAPER_CONVS.get(name),
        "conv_gflops": cost.conv_flops / 1e9,
        "dense_gflops": cost.dense_flops / 1e9,
        "total_gflops": cost.total_flops / 1e9,
        "conv_share": cost.conv_flops / max(cost.total_flops, 1),
        "paper_conv_time_share": PAPER_CONV_TIME_SHARE.get(name),
        "cache_mb": cost.conv_out_bytes / 2**20,
        "latency_ms": None,
        "compile_s": None,
    }
    if latency:
        fn = jax.jit(module.apply)
        start = time.perf_counter()
        jax.block_until_ready(fn(variables, x))
        row["compile_s"] = time.perf_counter() - start
        (timing,) = time_interleaved(
            [Timed(call=fn, prepare=lambda: (variables, x))], repeats, warmup=warmup
        )
        row["latency_ms"] = timing.median_ms
        row["latency_runs"] = repeats
    return row


def _format_table(rows: Sequence[dict[str, Any]]) -> str:
    def share(value: float | None) -> str:
        return f"{value:.1%}" if value is not None else "-"

    text = table([
        {"model": r["model"], "params": f"{r['params']:,}",
         "convs": f"{r['convs']}" + ("" if r["paper_convs"] in (None, r["convs"]) else "!"),
         "conv GFLOP": f"{r['conv_gflops']:.3f}", "total GFLOP": f"{r['total_gflops']:.3f}",
         "conv share": share(r["conv_share"]), "paper T1": share(r["paper_conv_time_share"]),
         "latency ms": "-" if r["latency_ms"] is None else f"{r['latency_ms']:.1f}",
         "cache MB": f"{r['cache_mb']:.2f}"}
        for r in rows
    ])  # fmt: skip
    return text + (
        "\npaper T1: conv share of time, DeepCache Table 1 (TensorFlow, Nexus 6). "
        "cache MB: float32 outputs of all convs (paper Figure 18: 2.5-43.8 MB)."
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``dcjax bench zoo``; returns the exit status (bad arguments exit with status 2)."""
    parser = program_parser("zoo", __doc__)
    parser.add_argument("--models", nargs="+", choices=models.names(), default=models.names())
    parser.add_argument("--repeats", type=at_least(1), default=10, help="timed runs per model")
    parser.add_argument("--warmup", type=nonnegative_int, default=2,
                        help="untimed runs after compiling")  # fmt: skip
    parser.add_argument("--no-latency", action="store_true", help="skip timing")
    parser.add_argument(
        "--out", default=os.path.join("bench-results", "models.json"), help="JSON output path"
    )
    args = parser.parse_args(argv)
    rows = []
    for name in args.models:
        print(f"measuring {name} ...", file=sys.stderr, flush=True)
        rows.append(
            measure(name, repeats=args.repeats, warmup=args.warmup, latency=not args.no_latency)
        )
    print(_format_table(rows))
    host = machine()
    result = {
        "benchmark": "dcjax bench zoo",
        **{
            k: host[k] for k in ("jax", "device", "platform", "cpu_count", "load_average", "memory")
        },
        "batch": 1,
        "models": rows,
    }
    write_json(args.out, result, indent=2)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0
