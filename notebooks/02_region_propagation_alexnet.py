# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Region propagation, layer by layer, on AlexNet
#
# DeepCache reuses a layer's cached output at pixel *p* only if every input
# pixel in *p*'s window was reusable. Starting from the matcher's input mask
# R0, the reusable region therefore *erodes* through every convolution and
# pooling layer (the paper's "cache erosion"). This notebook traces AlexNet,
# propagates masks through its jaxpr with `dcjax.transforms`, and draws the
# mask after conv1, pool1, conv2, pool2, ... .
#
# `DCJAX_NB_WIDTH` (default 1.0) shrinks the channels for quick test runs; the
# masks do not depend on it.

# %%
# %matplotlib inline
import os

import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

from dcjax import matching, models, video
from dcjax.transforms.analysis import analyze
from dcjax.transforms.interpreter import propagate_masks
from dcjax.transforms.motion import FrameContext
from dcjax.transforms.spatial import Spatial
from dcjax.transforms.trace import trace_model

WIDTH = float(os.environ.get("DCJAX_NB_WIDTH", "1.0"))
module, variables = models.create("alexnet", width=WIDTH)
shape = models.input_shape("alexnet")
traced = trace_model(module, variables, shape)
n = len(traced.leaves)
analysis = analyze(
    traced.jaxpr,
    [None] * n + [Spatial(axes=(1, 2), size=shape[:2], stride=(1, 1))],
    [False] * n + [True],
)
print([layer.name for layer in analysis.layers])

# %% [markdown]
# ## Propagating a mask
#
# `propagate_masks` evaluates the model densely and records, for every spatial
# variable, its value and its reuse mask. We keep the outputs of convolutions
# and max-pooling, in execution order.


# %%
def eqn_at(a, path):
    for i in path[:-1]:
        a = a.eqns[i].sub
    return a.jaxpr.jaxpr.eqns[path[-1]]


def layer_masks(frame, r0):
    ctx = FrameContext(jnp.zeros((2,), jnp.int32), "exact")
    x = models.preprocess("alexnet", jnp.asarray(frame))[None]
    _, recorded = propagate_masks(analysis, [*traced.leaves, x], [True] * n + [r0], ctx)
    out = [("input", np.asarray(r0))]
    pools = 0
    for (path, _), (sig, _value, mask) in recorded.items():
        eqn = eqn_at(analysis, path)
        kind = {"conv_general_dilated": "conv", "reduce_window_max": "pool"}.get(eqn.primitive.name)
        if kind == "pool":
            pools += 1
            name = f"pool{pools}"
        elif kind == "conv":
            name = str(eqn.source_info.name_stack).split("/")[1]
        else:
            continue
        m = np.broadcast_to(np.asarray(mask), sig.size)
        out.append((f"{name} {sig.size[0]}x{sig.size[1]}", m))
    return out


def show(masks, title):
    fig, axes = plt.subplots(1, len(masks), figsize=(2.2 * len(masks), 2.6))
    for ax, (name, m) in zip(axes, masks, strict=True):
        ax.imshow(m, cmap="RdYlGn", vmin=0, vmax=1, interpolation="nearest")
        ax.set_title(f"{name}\n{m.mean():.0%} reusable", fontsize=7)
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    plt.show()


# %% [markdown]
# ## One matched square
#
# Suppose only a 90x90 square in the middle of the frame matched. conv1 (11x11,
# stride 4) keeps the outputs whose window lies inside it, pool1 (3x3, stride 2)
# erodes one more ring, conv2 (5x5) two more, and so on: by conv5 little is
# left.

# %%
frame = next(iter(video.read(video.clip_path("vtest"), size=shape[:2], max_frames=1)))
square = np.zeros(shape[:2], bool)
square[68:158, 68:158] = True
masks = layer_masks(frame, jnp.asarray(square))
show(masks, "a matched 90x90 square eroding through AlexNet")
for name, m in masks:
    print(f"{name:40s} {m.sum():6d} of {m.size:6d} reusable")

# %% [markdown]
# ## A real frame pair
#
# The matcher's mask between two consecutive frames of the fixed-camera clip:
# the walking people are recomputed, and their holes grow layer by layer.

# %%
f0, f1 = list(video.read(video.clip_path("vtest"), size=shape[:2], max_frames=2))
match = matching.static_match(jnp.asarray(f0), jnp.asarray(f1), block_size=10, psnr_threshold=20.0)
show(layer_masks(f1, match.mask), f"vtest frames 0->1: {float(match.match_ratio):.0%} of blocks")
