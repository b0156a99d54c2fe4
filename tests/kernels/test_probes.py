"""Which candidates a layer's tuning measures (`dcjax.kernels.probes`)."""

import jax.numpy as jnp

from dcjax.kernels import ConvGeometry, plan
from dcjax.kernels import probes as pr


def _layer(h=12, cin=8, cout=8, k=3, groups=1, strides=(1, 1), dilation=(1, 1)):
    geometry = ConvGeometry(strides=strides, padding="SAME", groups=groups, dilation=dilation)
    return plan((1, h, h, cin), (k, k, cin // groups, cout), geometry)


def test_a_class_is_window_strides_dilation_grouping_and_dtype_not_size():
    base = pr.layer_class(_layer(), jnp.float32)
    assert pr.layer_class(_layer(h=20, cin=16, cout=32), jnp.float32) == base
    others = [
        pr.layer_class(_layer(k=1), jnp.float32),
        pr.layer_class(_layer(strides=(2, 2)), jnp.float32),
        pr.layer_class(_layer(dilation=(2, 2)), jnp.float32),
        pr.layer_class(_layer(groups=8), jnp.float32),  # depthwise
        pr.layer_class(_layer(cin=8, cout=8, groups=2), jnp.float32),  # grouped
        pr.layer_class(_layer(), jnp.bfloat16),
    ]
    assert len({base, *others}) == 7
    assert pr.layer_class(_layer(groups=8), jnp.float32)[4] == "depthwise"
    assert pr.layer_class(_layer(groups=2), jnp.float32)[4] == "grouped"


def test_the_probe_of_a_class_is_its_layer_of_most_dense_flops():
    layers = {
        "small": (_layer(h=8), jnp.float32),
        "wide": (_layer(h=8, cout=64), jnp.float32),  # 8x the FLOPs of "small"
        "big": (_layer(h=16), jnp.float32),  # 4x
        "pointwise": (_layer(k=1), jnp.float32),
        "same": (_layer(h=16), jnp.float32),  # ties with "big": the first is kept
    }
    assert pr.probes(layers) == {"wide", "pointwise"}
    del layers["wide"]
    assert pr.probes(layers) == {"big", "pointwise"}


def test_winners_are_the_least_at_some_fraction_below_one_ties_included():
    fractions = (0.0, 0.25, 0.5, 1.0)
    costs = {
        "dense": (1.0, 1.0, 1.0, 1.0),
        "xla": (0.1, 0.6, 1.2, 0.5),  # least at 1.0 only there: does not count
        "rows:64": (0.2, 0.5, 0.9, 1.1),
    }
    assert pr.winners(costs, fractions) == {"xla", "rows:64"}
    costs["xla"] = (0.3, 0.6, 1.2, 0.5)
    assert pr.winners(costs, fractions) == {"rows:64"}
    costs["xla"] = (0.2, 0.6, 1.2, 0.5)  # a tie with the row kernel at 0
    assert pr.winners(costs, fractions) == {"xla", "rows:64"}
    costs = {"dense": (0.1,) * 4, "xla": (0.2, 0.3, 0.4, 0.5)}
    assert pr.winners(costs, fractions) == {"dense"}
