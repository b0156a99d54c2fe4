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
# # A small benchmark
#
# The same harness as `dcjax bench`: every method steps through the same frames
# in one process, interleaved frame by frame, and is compared with two
# baselines: the plain `jax.jit(model.apply)` ("vs plain") and dcjax's own
# dense lowering, `nocache` ("vs dense"). Both are ratios of mean times per
# frame, refresh and still frames included (matching too); the ideal speedup is
# what the skipped FLOPs would give.
#
# Environment variables (for quick test runs): `DCJAX_NB_MODELS` (default
# `alexnet`), `DCJAX_NB_FRAMES` (default 40), `DCJAX_NB_WIDTH` (default 1.0).
# Timings on a shared machine are noisy: compare within one run.

# %%
# %matplotlib inline
import os

import matplotlib.pyplot as plt  # noqa: F401  (selects the inline backend in Jupyter)
from IPython.display import display

# %%
from dcjax.bench import evaluation
from dcjax.eval import plots, report

MODELS = os.environ.get("DCJAX_NB_MODELS", "alexnet").split()
FRAMES = int(os.environ.get("DCJAX_NB_FRAMES", "40"))
WIDTH = float(os.environ.get("DCJAX_NB_WIDTH", "1.0"))

records, matcher_rows = evaluation.run_bench(
    MODELS,
    ["vtest"],
    ["nocache", "deepcache", "deepmon", "mil", "frame"],
    frames=FRAMES,
    width=WIDTH,
    thresholds=[15, 25],
    matchers=["static", "diamond", "histogram"],
    progress=False,
)

# %% [markdown]
# ## Summary

# %%
rows = report.summary_rows(records)
cols = ["model", *report.SHORT_COLUMNS]
print("  ".join(f"{c:>12s}" for c in cols))
for row in rows:
    print("  ".join(f"{row[c][-12:]:>12s}" for c in cols))

# %% [markdown]
# ## Latency by method (DeepCache Figure 10)

# %%
display(plots.latency_by_method(records))

# %% [markdown]
# ## Where the savings are, layer by layer (Figure 12)

# %%
display(plots.per_layer(records))

# %% [markdown]
# ## Matching threshold (Figure 16) and matchers (Table 4)

# %%
display(plots.sweep(records, "psnr_threshold"))
display(plots.matchers(matcher_rows))
