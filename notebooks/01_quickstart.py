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
# # dcjax quick start
#
# `dcjax.deepcache.transform` compiles a CNN into a per-frame step that reuses the
# work done on the previous frame wherever the frame did not change (DeepCache,
# MobiCom'18). This notebook transforms a model, steps it through a real clip,
# and looks at what was reused.
#
# Sizes come from environment variables so that the test suite can run the
# notebook quickly: `DCJAX_NB_MODEL` (default `efficientnet_lite0`, pretrained),
# `DCJAX_NB_FRAMES` (default 40) and `DCJAX_NB_WIDTH` (channel multiplier,
# default 1.0).

# %%
# %matplotlib inline
import os

import jax
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import display

from dcjax import deepcache, models, video
from dcjax.eval import harness, plots

MODEL = os.environ.get("DCJAX_NB_MODEL", "efficientnet_lite0")
FRAMES = int(os.environ.get("DCJAX_NB_FRAMES", "40"))
WIDTH = float(os.environ.get("DCJAX_NB_WIDTH", "1.0"))
PRETRAINED = WIDTH == 1.0 and models.info(MODEL).pretrained

# %% [markdown]
# ## A model and a clip
#
# Every zoo model comes as a Flax module and its variables; `preprocess` is the
# model's per-pixel input normalisation (per pixel, so it commutes with reuse).
# The bundled clip `vtest` is a fixed camera over a street.

# %%
kwargs = {"pretrained": True} if PRETRAINED else {"width": WIDTH}
module, variables = models.create(MODEL, **kwargs)
shape = models.input_shape(MODEL)
frames = np.stack(list(video.read(video.clip_path("vtest"), size=shape[:2], max_frames=FRAMES)))
print(MODEL, "pretrained" if PRETRAINED else f"random, width {WIDTH}", frames.shape)

# %% [markdown]
# ## Transform
#
# The model is traced once; every convolution becomes a reuse step. The
# `Config` holds the matcher's block size and PSNR threshold, the refresh
# period and the sparse kernel.

# %%
config = deepcache.Config(kernel="auto")
cached = deepcache.transform(
    module,
    variables,
    frame_shape=shape,
    config=config,
    preprocess=lambda f: models.preprocess(MODEL, f),
)
print(len(cached.layers), "reused convolutions,", f"{cached.total_flops / 1e9:.2f} GFLOPs")
for layer in cached.layers[:5]:
    stride = tuple(map(int, layer.signature.stride))
    print(f"  {layer.name:40s} out {layer.out_shape}  stride {stride}")

# %% [markdown]
# ## Step through the clip
#
# `step(state, frame)` is jitted and pure: it returns the output, the new state
# and an `info` dict. `flops_ratio` is the fraction of the FLOPs of
# convolutions and matrix products that had to be computed.

# %%
state = cached.init()
outs, infos = [], []
for f in frames:
    out, state, info = cached.step(state, f)
    outs.append(np.asarray(out))
    infos.append(jax.tree_util.tree_map(np.asarray, info))
ratios = np.array([float(i["flops_ratio"]) for i in infos])
matched = np.array([float(i["match_ratio"]) for i in infos])
print(f"mean match ratio {matched[1:].mean():.1%}, ideal speedup {1 / ratios.mean():.2f}x")

# %% [markdown]
# Compare with the uncached model on the same frames.

# %%
full = np.stack([np.asarray(cached.apply(f)) for f in frames])
outs = np.stack(outs)
agree = outs.reshape(len(frames), -1).argmax(-1) == full.reshape(len(frames), -1).argmax(-1)
print(f"top-1 agreement {agree.mean():.1%}, max |diff| {np.abs(outs - full).max():.3g}")
if PRETRAINED:
    labels = models.imagenet_labels()
    print("top-1 on the last frame:", labels[int(full[-1].argmax())])

# %% [markdown]
# ## What was reused
#
# The reuse mask of the input frame (green: reused, red: recomputed), and how
# much of each layer's output came from the cache.

# %%
masks = harness.input_masks(
    dict(
        block_size=config.block_size, psnr_threshold=config.psnr_threshold, matcher=config.matcher
    ),
    frames,
    np.array([bool(i["refreshed"]) for i in infos]),
)
picks = [int(i) for i in np.linspace(1, len(frames) - 1, 4).round()]
display(plots.mask_strip(frames, masks, picks))

# %%
reuse = np.stack([i["reuse_fraction"] for i in infos])[1:].mean(0)
fig, ax = plt.subplots(figsize=(9, 3))
ax.bar(np.arange(len(reuse)), reuse)
ax.set_xlabel("convolution (execution order)")
ax.set_ylabel("mean reuse fraction")
plt.show()
