"""The reuse ceiling: what a reuse setting could save at best, and what it costs in fidelity.

A measured speedup mixes two things: how much work a setting lets the step
skip, and how fast the kernels skip it. This module measures the first alone,
together with its price in fidelity, so that a target of the form "speedup X at
top-1 agreement Y" can be checked against what any kernel could reach.

`reuse_ceiling` runs each `deepcache.Config` over the same frames with
``kernel="reference"`` (every reused layer keeps a cache and its output is
``where(mask, shifted cache, dense op)``, the oracle every sparse kernel equals),
and records, per setting:

- ``ideal_speedup``: ``1 / mean(flops_ratio)`` over the frames, refreshes
  included, as `dcjax.eval.metrics` defines it (the FLOPs of convolutions and
  matrix products a perfect kernel would compute, matching free);
  ``ideal_speedup_reuse``: the same over the frames that were not refreshed;
- ``top1_agreement``, ``top5_agreement``, ``top1_stability`` and
  ``output_rel_mse`` against the model itself (`dcjax.eval.metrics`), on the
  same frames;
- ``input_reuse``: the mean fraction of input pixels the matcher reused.

Why ``kernel="reference"``: under ``kernel="auto"`` a layer too small or too
thin for a sparse kernel to pay on the backend is computed in full on every
frame, and its output is then exact. The bench's ``ideal_speedup`` still counts
what such layers could skip, while its fidelity is that of the layers that
really reuse. Here both numbers describe one computation: every reuse the masks
allow is taken.

`best` picks, among records, the setting with the largest ideal speedup whose
top-1 agreement reaches a target: no kernel can make that setting faster than
its ideal, so where a target speedup exceeds it, the target is out of reach for
this model on this clip at that agreement, whatever the kernels do.

`sweep_configs` lists the settings of a sweep of PSNR thresholds,
``RefineConfig.delta`` values and refinement layer rules; ``dcjax bench
ceiling`` (`dcjax.bench.ceiling`) runs one on a zoo model and a video.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dcjax import deepcache
from dcjax.config import Config, RefineConfig
from dcjax.eval import metrics

__all__ = ["best", "reuse_ceiling", "sweep_configs"]


def sweep_configs(
    thresholds: Sequence[float],
    deltas: Sequence[float],
    layers: Sequence[str] = ("auto",),
    base: Config | None = None,
) -> dict[str, Config]:
    """Label -> `Config` for every (threshold, delta, layers) of a sweep.

    A ``delta`` of 0 is plain DeepCache (no `RefineConfig`), listed once per
    threshold whatever ``layers`` says. Labels read ``psnr=20 delta=0.05
    layers=auto`` (``psnr=20`` alone for plain DeepCache).
    """
    base = Config() if base is None else base
    configs: dict[str, Config] = {}
    for t in thresholds:
        for d in deltas:
            for lay in layers if d > 0 else layers[:1]:
                label = f"psnr={t:g}" + (f" delta={d:g} layers={lay}" if d > 0 else "")
                refine = RefineConfig(delta=float(d), layers=lay) if d > 0 else None
                configs[label] = dataclasses.replace(base, psnr_threshold=float(t), refine=refine)
    return configs


def reuse_ceiling(
    module: Any,
    variables: Any,
    frames: np.ndarray,
    configs: Mapping[str, Config],
    *,
    preprocess: Any = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """The ideal speedup and fidelity of each setting over ``frames`` (module docstring).

    Args:
        module, variables: the model, as `deepcache.transform` takes it (a
            Flax module or ``fn(variables, x)``); the reference is its own
            output (`CachedModel.apply`).
        frames: (T, H, W, 3) uint8 frames, T >= 2.
        configs: label -> `Config`; each is run with ``kernel="reference"``
            and its statistics on, whatever it says.
        preprocess: the model's per-pixel preprocessing (`deepcache.transform`).
        progress: a progress bar over the settings.

    Returns:
        One record per setting, in ``configs`` order: ``label``,
        ``psnr_threshold``, ``delta`` (0 without refinement), ``layers``
        (None without refinement), ``frames``, ``ideal_speedup``,
        ``ideal_speedup_reuse`` (None when every frame was refreshed),
        ``input_reuse``, ``refreshes``, ``top1_agreement``,
        ``top5_agreement``, ``top1_stability`` (None for outputs that are not
        class scores) and ``output_rel_mse`` (None for a constant output).
    """
    frames = np.asarray(frames)
    if frames.ndim != 4 or len(frames) < 2:
        raise ValueError(f"dcjax: frames must be (T, H, W, C) with T >= 2, got {frames.shape}")
    if not configs:
        raise ValueError("dcjax: no settings to measure")
    dev = jnp.asarray(frames)
    reference = None
    items = list(configs.items())
    if progress:
        from tqdm.auto import tqdm

        items = tqdm(items, desc="settings", unit="setting", leave=False)
    records = []
    for label, cfg in items:
        cfg = dataclasses.replace(cfg, kernel="reference", statistics=True)
        cached = deepcache.transform(
            module, variables, frame_shape=frames.shape[1:], config=cfg, preprocess=preprocess
        )
        if reference is None:  # the untransformed model, preprocessing included
            reference = np.stack([_output(cached.apply(f)) for f in dev])
        outs, _, infos = cached.run(dev, cached.init())
        outputs = np.stack(
            [_output(jax.tree.map(lambda a, t=t: a[t], outs)) for t in range(len(dev))]
        )
        ratio = np.asarray(infos["flops_ratio"], np.float64)
        refreshed = np.asarray(infos["refreshed"], bool)
        quality = metrics.fidelity(reference, outputs)
        del quality["output_mse"]
        records.append(
            {
                "label": label,
                "psnr_threshold": cfg.psnr_threshold,
                "delta": cfg.refine.delta if cfg.refine is not None else 0.0,
                "layers": _layers_name(cfg.refine),
                "frames": len(frames),
                "ideal_speedup": metrics.ideal_speedup(ratio),
                "ideal_speedup_reuse": metrics.ideal_speedup(ratio[~refreshed])
                if (~refreshed).any()
                else None,
                "input_reuse": float(np.mean(np.asarray(infos["input_reuse"]))),
                "refreshes": int(refreshed.sum()),
                **quality,
            }
        )
    return records


def best(records: Sequence[Mapping[str, Any]], target: float) -> Mapping[str, Any] | None:
    """The record with the largest ``ideal_speedup`` whose ``top1_agreement`` is at
    least ``target``; None when none reaches it (or the outputs are not class
    scores)."""
    ok = [r for r in records if r["top1_agreement"] is not None and r["top1_agreement"] >= target]
    return max(ok, key=lambda r: r["ideal_speedup"]) if ok else None


def _output(out: Any) -> np.ndarray:
    """One frame's output as the harness compares it (`harness.first_leaf`), in float64."""
    from dcjax.eval.harness import first_leaf

    return first_leaf(out).astype(np.float64)


def _layers_name(refine: RefineConfig | None) -> str | None:
    if refine is None:
        return None
    return refine.layers if isinstance(refine.layers, str) else ",".join(refine.layers)
