"""The model-zoo benchmark's FLOP counting and its command (static numbers only)."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
from jax import lax

from dcjax.bench import zoo


def test_count_cost_on_known_ops():
    def f(x, k, g, w):
        y = lax.conv_general_dilated(
            x, k, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )  # (1, 4, 4, 6), 3x3x4 window: 2 * 96 * 36
        z = lax.conv_general_dilated(
            y,
            g,
            (1, 1),
            "SAME",
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
            feature_group_count=2,
        )  # (1, 4, 4, 6), 1x1x3 window: 2 * 96 * 3
        p = lax.reduce_window(z, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        h = jnp.maximum(p, 0.0).reshape(1, -1)  # 24 max ops
        return h @ w  # 2 * 5 * 24

    x = jnp.zeros((1, 8, 8, 4))
    k = jnp.zeros((3, 3, 4, 6))
    g = jnp.zeros((1, 1, 3, 6))
    w = jnp.zeros((24, 5))
    cost = zoo.count_cost(jax.make_jaxpr(f)(x, k, g, w).jaxpr)
    assert cost.convs == 2
    assert cost.conv_flops == 2 * 96 * 36 + 2 * 96 * 3
    assert cost.dense_flops == 2 * 5 * 24
    assert cost.other_flops == 24 * 4 + 24
    assert cost.conv_out_bytes == 2 * 96 * 4


def test_command_writes_json(tmp_path, capsys):
    out = tmp_path / "models.json"
    assert zoo.main(["--models", "dave", "--no-latency", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "dave" in printed and "252,219" in printed
    result = json.loads(out.read_text())
    (row,) = result["models"]
    assert row["model"] == "dave" and row["params"] == 252_219
    assert row["convs"] == row["paper_convs"] == 5
    # conv1 alone: 31x98 outputs x 24 channels x 5*5*3 window x 2.
    assert row["conv_gflops"] * 1e9 > 2 * 31 * 98 * 24 * 75
    assert 0.9 < row["conv_share"] < 1.0
    # Float32 outputs of the five convolutions (31x98x24, 14x47x36, 5x22x48, 3x20x64, 1x18x64).
    conv_floats = 31 * 98 * 24 + 14 * 47 * 36 + 5 * 22 * 48 + 3 * 20 * 64 + 1 * 18 * 64
    assert abs(row["cache_mb"] * 2**20 - 4 * conv_floats) < 1
    assert row["latency_ms"] is None
