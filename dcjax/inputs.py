"""Checks of what users hand a cached model: frames, matches, preprocess functions.

Contract: each check returns its argument in the form the step takes, or
raises `TypeError` / `ValueError` with a one-line message that names the
argument, what was expected and what was given. Nothing here runs per frame
on the device except `check_float_range`, one reduction, which a model makes
until its first concrete float frame passes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dcjax.matching import Match
from dcjax.step import frame_input
from dcjax.transforms.analysis import analyze
from dcjax.transforms.spatial import Spatial

__all__ = ["check_float_range", "check_frame", "check_match", "check_preprocess"]


def check_frame(frame: Any, name: str, ndim: int, frame_shape: tuple) -> jax.Array:
    """``frame`` as an array of ``ndim`` axes (3: one frame; 4: ``(T, H, W, C)``)
    ending in ``frame_shape``, uint8 or floating point."""
    if not hasattr(frame, "shape") or not hasattr(frame, "dtype"):
        try:
            frame = jnp.asarray(frame)
        except TypeError as e:
            raise TypeError(f"dcjax: {name} must be an array, got {type(frame).__name__}") from e
    dtype = jnp.dtype(frame.dtype)
    if not (dtype == jnp.uint8 or jnp.issubdtype(dtype, jnp.floating)):
        raise TypeError(
            f"dcjax: {name} has dtype {dtype.name}; pass uint8 (0-255) or floating-point frames"
        )
    want = frame_shape if ndim == 3 else ("T", *frame_shape)
    shape = tuple(frame.shape)
    if len(shape) != ndim:
        raise ValueError(
            f"dcjax: {name} must have shape {tuple(want)}, got an array of shape {shape}"
        )
    if shape[-3:] != frame_shape:
        what = "frame" if ndim == 3 else "frames"
        raise ValueError(
            f"dcjax: {what} has shape {shape[-3:]} but the model was transformed for {frame_shape}"
        )
    return frame


def check_float_range(frame: jax.Array, name: str) -> bool:
    """Whether ``frame`` was checked: float frames are matched with a PSNR peak of
    1.0 unless `Config.data_range` says otherwise, so concrete float frames must
    lie in [0, 1] (uint8 and traced frames are not checked: False)."""
    if not jnp.issubdtype(frame.dtype, jnp.floating) or isinstance(frame, jax.core.Tracer):
        return False
    peak = float(jnp.max(jnp.abs(frame)))
    if peak > 1.0 + 1e-3:
        raise ValueError(
            f"dcjax: {name} holds floating-point values up to {peak:g}, but float "
            "frames are matched with a PSNR peak of 1.0; scale them to [0, 1], pass "
            "uint8 frames, or set Config(data_range=...) to their peak value"
        )
    return True


def check_match(match: Match | None, frame_shape: tuple, *, batched: bool) -> Match | None:
    """``match`` with an int32 motion of whole pixels, a bool mask of the frames'
    ``(H, W)`` and a match ratio (the mask's mean where not given); ``batched``:
    a leading T axis."""
    if match is None:
        return None
    if not isinstance(match, Match):
        raise TypeError(f"dcjax: match must be a deepcache.Match, got {type(match).__name__}")
    lead = (-1,) if batched else ()
    motion = jnp.asarray(match.motion)
    if not jnp.issubdtype(motion.dtype, jnp.integer):
        traced = isinstance(motion, jax.core.Tracer)
        if not traced and not bool(jnp.all(motion == jnp.round(motion))):
            raise ValueError(
                f"dcjax: match.motion must be whole pixels, got {np.asarray(motion).tolist()}"
            )
    motion = motion.astype(jnp.int32)
    mask = jnp.asarray(match.mask)
    hw = frame_shape[:2]
    if motion.shape[-1:] != (2,) or motion.ndim != len(lead) + 1:
        raise ValueError(f"dcjax: match.motion must be (dy, dx), got shape {motion.shape}")
    if mask.shape[-2:] != hw or mask.ndim != len(lead) + 2:
        raise ValueError(f"dcjax: match.mask has shape {mask.shape} but frames are {hw} (H, W)")
    ratio = match.match_ratio
    if ratio is None:
        ratio = mask.astype(jnp.float32).mean(axis=(-2, -1))
    return Match(motion=motion, mask=mask.astype(bool), match_ratio=ratio)


def check_preprocess(preprocess: Callable, frame_shape: tuple, input_dtype: Any) -> None:
    """Raise where ``preprocess`` does not act on each pixel alone, the same way at
    every position (reuse masks refer to frame pixels that move with the scene;
    a per-pixel mean image or coordinates do not move)."""
    frame = jax.ShapeDtypeStruct(frame_shape, jnp.uint8)
    closed = jax.make_jaxpr(lambda f: frame_input(f, preprocess, input_dtype))(frame)
    sig = Spatial(axes=(0, 1), size=frame_shape[:2], stride=(1, 1))
    analysis = analyze(closed, [sig], [True])

    def why(a) -> str | None:
        for eqn, info in zip(a.jaxpr.jaxpr.eqns, a.eqns):
            if info.sub is not None and (found := why(info.sub)):
                return found
            if any(info.anchored):
                return f"{eqn.primitive.name} with a value that varies along H or W"
            if not info.supported:
                return f"{eqn.primitive.name}, which has no reuse rule"
        return None

    found = why(analysis)
    if found is None and analysis.out_sigs[0] != sig:
        found = "an operation that moves or mixes pixels"
    if found is not None:
        raise ValueError(
            "dcjax: preprocess must act on each pixel alone, the same way at every "
            f"position; it uses {found}. Put position-dependent steps (a per-pixel "
            "mean image, coordinates) inside the model, where they are handled"
        )
