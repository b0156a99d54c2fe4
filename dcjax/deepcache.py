"""`transform`: compile a model into a per-frame step that reuses earlier work.

::

    import dcjax
    cached = dcjax.transform(model, variables, frame_shape=(227, 227, 3))
    state = cached.init()
    out, state, info = cached.step(state, frame)       # jitted
    outs, state, infos = cached.run(frames, state)     # lax.scan over frames

The model (a Flax module or ``fn(variables, x)``) is traced once to a jaxpr
(`dcjax.transforms.trace_model`) and analysed (`dcjax.transforms.analyze`:
spatial signatures, reused layers); `dcjax.plan.make_plan` decides what the
step does at each layer, and `dcjax.step.Step` is the step: its convolutions
become reuse steps ``out_t = where(R_out, shift(cache_{t-1}, M/s), conv(x_t))``
with ``R_out`` derived from the matcher's input mask ``R0`` by the
per-primitive rules of `dcjax.transforms.regions` (docs/design.md). `step` is
pure: ``step(state, frame) -> (output, state, info)``; `run` is a `lax.scan`
of it; nothing is retraced per frame.

Frames are ``(H, W, C)`` arrays, uint8 or floating point. Unless a
``preprocess`` function is given, uint8 frames are divided by 255 and float
frames are passed as they are, in ``input_dtype``. ``preprocess`` must act per
pixel (normalisation, colour conversion), since reuse masks refer to pixels.
The matcher sees the raw frames.

The output is what ``model.apply(variables, frame[None])`` returns (with its
batch axis of 1).

A frame is recomputed in full (R0 all false) on the first frame, every
``refresh_every`` frames, when fewer than ``min_match`` of the blocks match,
and when the frame holds NaN or Inf; such a frame is not used as the cache key
for the next one, which is then recomputed in full too. A still frame (every
input pixel reusable, no motion) returns the last output without running the
network (`Config.skip_unchanged`, on by default).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from dcjax import autotune, race
from dcjax.cached_model import CachedModel
from dcjax.config import Config, RefineConfig, SemanticConfig
from dcjax.kernels import auto
from dcjax.kernels.tuning import resolve_tuning
from dcjax.matching import Match
from dcjax.state import CacheState
from dcjax.transforms import queries

__all__ = [
    "CacheState",
    "calibrate",
    "CachedModel",
    "Config",
    "Match",
    "RefineConfig",
    "SemanticConfig",
    "transform",
]


def transform(
    model: Any,
    variables: Any,
    *,
    frame_shape: tuple[int, int, int],
    config: Config | None = None,
    preprocess: Callable[[jax.Array], jax.Array] | None = None,
    input_dtype: Any = jnp.float32,
    calibration: Any = None,
    progress: bool = True,
) -> CachedModel:
    """Compile ``model`` into a cached per-frame step.

    Args:
        model: a `flax.linen.Module` (called as ``model.apply(variables, x)``)
            or a callable ``fn(variables, x)``; ``x`` has a leading batch axis.
        variables: the model's variables (params, batch stats, ...).
        frame_shape: ``(H, W, C)`` of the frames.
        config: a `Config`; default ``Config()``.
        preprocess: per-pixel function from a raw ``(H, W, C)`` frame to the
            model's input; default divides uint8 frames by 255.
        input_dtype: dtype the model is traced with.
        calibration: a few frames ``(T, H, W, C)`` of the stream (T >= 2) for
            the measured tuning (``Config.tuning``): each layer's kernel is
            chosen for the dirty fraction these frames show there, found by
            running them through the model with every layer cached, and the
            block matcher's cost is timed on them; then the tuned plan, the
            dense plan (`dcjax.autotune.dense_config`), the dense step
            without a matcher (`dcjax.autotune.nocache_config`) and, where
            the tuned kernels differ from the fixed rules', the fixed rules'
            plan (``tuning="prior"``), and the tuned plan with the layers
            these frames dirty most computed in full (the cut plans,
            `dcjax.autotune.cut_tuning`, one per `dcjax.autotune.CUTS`
            that changes a kernel) race over the frames, and the fastest
            is returned (``tuning.plan``, ``tuning.raced``) where it is
            faster beyond the race's noise; on a tie the plan first in
            `dcjax.autotune.PREFERENCE` (`dcjax.race.race_winner`). None: kernels
            chosen for every fraction alike, no race. Ignored where tuning
            does not run.
        progress: show a progress bar while kernels are measured.

    Returns:
        A `CachedModel` with ``init``, ``step``, ``run``, ``apply`` and
        ``layers``.
    """
    config = Config() if config is None else config
    fractions = None
    if (
        calibration is not None
        and isinstance(config, Config)
        and config.kernel == "auto"
        and config.semantic is None
        and resolve_tuning(config.tuning) == "measure"
    ):
        fractions = calibrate(
            model, variables, frame_shape=frame_shape, frames=calibration, config=config,
            preprocess=preprocess, input_dtype=input_dtype,
        ).layers  # fmt: skip
    cached = CachedModel(
        model,
        variables,
        frame_shape=frame_shape,
        config=config,
        preprocess=preprocess,
        input_dtype=input_dtype,
        tuning_fractions=fractions,
        tuning_frames=None if fractions is None else calibration,
        progress=progress,
    )
    cached.calibration = calibration
    tuning = cached.tuning
    if fractions is None or tuning is None or tuning.plan == "nocache":
        return cached
    if not autotune.may_fall_back(config):
        return cached
    # The layers' measurements leave out what the step adds around them: the
    # plans race over the calibration frames, and the fastest is kept where it
    # is faster beyond noise (else the preferred of those it ties with). A dense
    # plan races the step without a matcher (on a small network the still-frame
    # test may cost more than the still frames save); a cached plan races the
    # fixed rules' kernels too, where they differ (layers timed alone mispredict
    # a network whose branches XLA runs side by side), and its cuts: the layers
    # the stream dirties most computed in full.
    plans = [
        p for p in autotune.PLANS[autotune.PLANS.index(tuning.plan) :] if p not in ("prior", "cut")
    ]
    makes = {
        "dense": autotune.dense_config,
        "nocache": autotune.nocache_config,
        "prior": lambda c: dataclasses.replace(c, tuning="prior"),
    }

    def made(plan: str) -> CachedModel:
        return CachedModel(
            model, variables, frame_shape=frame_shape, config=makes[plan](config),
            preprocess=preprocess, input_dtype=input_dtype,
        )  # fmt: skip

    models = [cached] + [made(plan) for plan in plans[1:]]
    if tuning.plan == "cached" and _unlike_prior(cached):
        plans.append("prior")
        models.append(made("prior"))
    tunings = [tuning] * len(models)  # what each model's tuning record becomes if it wins
    if tuning.plan == "cached":
        for cut in autotune.CUTS:
            t = autotune.cut_tuning(tuning, cut)
            if t is not None and t.choices not in {u.choices for u in tunings}:  # a new cut
                tunings.append(t)
                plans.append("cut")
                models.append(cached.with_tuning(t))
    samples = race.race_samples(models, calibration)
    times = race.race_figures(samples)
    preference = sorted(range(len(plans)), key=lambda i: autotune.PREFERENCE.index(plans[i]))
    best = race.race_winner(samples, preference)
    winner = models[best]
    by_plan: dict[str, float] = {}
    for plan, t in zip(plans, times, strict=True):  # the fastest of the cuts
        by_plan[plan] = min(t, by_plan.get(plan, float("inf")))
    raced = tuple(float(by_plan.get(p, float("nan"))) for p in autotune.PLANS)
    winner.tuning = dataclasses.replace(tunings[best], plan=plans[best], raced=raced)
    winner.calibration = calibration
    return winner


def _unlike_prior(cached: CachedModel) -> bool:
    """Whether the measured kernels of ``cached`` differ from what the fixed
    rules (`dcjax.kernels.auto.choose`) give some layer."""
    backend = jax.default_backend()
    tiles = queries.layer_tile_plans(cached._analysis)
    for p, lp, choice in zip(tiles, cached.plan.layers, cached.tuning.choices, strict=True):
        if p is not None and choice is not None:
            if auto.choose(p, backend, scattered=lp.refined)[0] != choice.impl:
                return True
    return False


def calibrate(
    model: Any,
    variables: Any,
    *,
    frame_shape: tuple[int, int, int],
    frames: Any,
    config: Config | None = None,
    preprocess: Callable[[jax.Array], jax.Array] | None = None,
    input_dtype: Any = jnp.float32,
) -> autotune.Calibration:
    """The dirty fractions ``frames`` (``(T >= 2, H, W, C)``) show, per layer and
    at the input, run with every layer cached (`dcjax.autotune.stream_fractions`)."""
    frames = jnp.asarray(frames)
    if frames.ndim != 4 or frames.shape[0] < 2 or tuple(frames.shape[1:]) != tuple(frame_shape):
        raise ValueError(
            "dcjax: calibration must be frames of shape (T >= 2, "
            f"{', '.join(map(str, frame_shape))}), got {tuple(frames.shape)}"
        )
    config = Config() if config is None else config
    probe = CachedModel(
        model, variables, frame_shape=frame_shape,
        config=dataclasses.replace(
            config, kernel="xla", tuning="prior", fuse_blocks=False, statistics=True
        ),
        preprocess=preprocess, input_dtype=input_dtype,
    )  # fmt: skip
    _, _, infos = probe.run(frames)
    return autotune.stream_fractions(jax.device_get(infos), len(probe.layers))
