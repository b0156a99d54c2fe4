"""Refinement of reuse masks inside the network, with a bounded error.

Exact region propagation has a ceiling: every convolution dilates the
non-reusable region by half its kernel. Refinement adds a cheap per-pixel
change test at the input ``x`` of each refined convolution ``l``, against a
reference copy ``ref`` of that input (shifted with the frame's motion like
every cache)::

    change[i, j] = max_c |x_t[.., i, j, c] - ref[.., i, j, c]|     (metric "max_abs")
                 = sqrt(mean_c (x_t - ref)^2)                         (metric "rms")
    R_in'        = R_in OR (change < delta_l)
    ref         <- x_t where not (change < delta_l), else kept

and the layer's output mask is the usual AND-pool of ``R_in'``. A map whose
``R_in`` is already all reusable (a still scene: every block matched, no
motion) is not tested (on CPU, in a loop of zero trips): ``R_in'`` is all
reusable whatever the test says, and the reference keeps the values the caches
were computed from (see docs/performance-notes.md, "Refinement: no change test
on a map that is already all reusable"). The threshold is
``delta_l = delta * scale_l`` where ``scale_l`` is the mean per-pixel magnitude
of the layer's input (the same metric applied to ``x`` against zero) on the
first frame: one user-facing knob instead of a per-layer search.

The error bound (max_abs). Take an output pixel ``o`` reused at frame ``t``;
its cached value was computed at the last frame ``tau < t`` at which ``o`` was
dirty, from ``x_tau``. At every frame in ``(tau, t]`` all pixels ``j`` of
``o``'s window passed the test, so their references did not change after
``tau``; at ``tau`` each reference was either set to ``x_tau[j]`` or kept within
``delta_l`` of it. Hence ``|x_t[j] - x_tau[j]| < 2 delta_l`` for every channel,
and for every output channel ``c``::

    |out_t[o, c] - conv(x_t)[o, c]| < 2 delta_l * sum_{window, c_in} |W[.., c_in, c]|

(for "rms", ``2 delta_l sqrt(C_in) * sum_window ||W[k, :, c]||_2``). The bound
depends on ``delta_l`` and the weights only, not on how long the stream is:
errors do not accumulate across frames, because the reference tracks the last
value each output was computed from rather than the last frame. A refresh sets
every reference to the frame's input. Pixels reused through the matcher (exact
matches) are outside this bound; they are DeepCache's own approximation,
controlled by the PSNR threshold.

With fused epilogues (`Config.fuse_epilogues`) the cache holds the output of
the elementwise chain after the convolution rather than the convolution's; the
bound above is on the convolution, and the chain moves it by at most its
Lipschitz constant per channel (``|gamma| / sigma`` for a batch norm, 1 for
ReLU); a fused residual add adds the residual branch's own error, which is
bounded the same way since the chain's output is reused only where the
residual is.

``layers="auto"`` refines a convolution only where the test is cheaper than the
work it can save: the test is a pass over the input and its reference (a
subtraction, an absolute value, a max over channels, the reference's update),
at memory speed, while the convolution spends ``kh * kw * (C_out / groups) /
(sy * sx)`` multiply-adds per input element at matrix-product speed; a layer is
refined when that is at least `AUTO_MIN_MACS_PER_INPUT` (160): depthwise
convolutions are not, 3x3 convolutions of 32 channels and more and wide 1x1
ones are (see docs/performance-notes.md, "Refinement `layers="auto"`:
convolutions from 160 multiply-adds per input element"). Nor does ``"auto"``
refine a convolution that reads the frame itself (through elementwise
preprocessing or pooling, with no reused layer in between: the stem) when a
block matcher runs: the matcher's PSNR test already decides reuse on that
input, and a pixel test behind it adds error without adding reuse (see
docs/performance-notes.md, "Refinement `layers="auto"`: layers that read the
frame are left to the block matcher"). With ``matcher="none"`` (the
``delta`` baseline) the stem's test is the only reuse at the input, and it is
refined whatever its cost.

Fully connected layers (`dcjax.transforms.records.DenseLayer`: ``y = x @ W`` on a
flattened or pooled map, ``W`` of shape ``(K, N)``) get the same test per
input element, against a reference ``x_ref`` whose product ``y_ref = x_ref @
W`` the state keeps (DeltaCNN's update for linear layers)::

    changed = |x_t - x_ref| >= delta_l and x_t != x_ref       (per element)
    y       = y_ref + (x_t - x_ref)[changed] @ W[changed]    (rows of W read)
    x_ref   <- x_t where changed;  y_ref <- y

with ``delta_l = delta * scale_l``, ``scale_l`` the mean ``|x|`` of the first
frame's input (`dense_scale`; a vector has no pixels, so both metrics are
``|x_t - x_ref|`` per element). ``x_t != x_ref`` holds for the layers
plain DeepCache updates exactly (`Config.dense_updates`: at ``delta_l = 0``
it leaves out the inputs equal to their reference), so that ``delta = 0``
is plain DeepCache. Where more than `DENSE_FRACTION` of the
inputs changed, on a refresh and on the first frame, the product is computed
in full and ``x_ref`` set to ``x_t``. Since ``y_ref = x_ref @ W`` and every
element left out is within ``delta_l`` of its reference, for each output ``j``::

    |y[j] - (x_t @ W)[j]| < delta_l * sum_i |W[i, j]|          (`dense_error_bound`)

whatever the stream's length (up to the float32 rounding of the updates
added since the last full product, a relative ~1e-7 each). So that rounding
stays bounded on an endless stream (``refresh_every=None``), each layer also
computes its product in full every `DENSE_REANCHOR_EVERY` frames, on a
schedule of its own (layer ``i`` on the frames ``t`` with ``(t + i) %
DENSE_REANCHOR_EVERY == 0``: the layers do not all pay on the same frame). The update reads
only the rows of ``W`` of the changed inputs (`dcjax.kernels.matvec`). Under
``layers="auto"`` a fully connected layer is refined when it has at least
`AUTO_MIN_DENSE_WEIGHTS` (4 Mi) weights and `AUTO_MIN_DENSE_OUTPUTS` (16)
outputs: smaller ones cost little, and the classifier heads behind a global
average pool see every input move a little, so the test would add error for
little time (see docs/performance-notes.md, "Refinement of fully connected
layers: large layers only").

Convolutions that read the same variable (ResNet's ``conv1`` and
``downsample``, an inception module's branches) have equal tests: the same
values, reference, scale and validity. The first of them keeps the reference
and the others reuse its test (`dcjax.deepcache`), so each feature map is read
by one test per frame and held once in the state.

Whatever ``layers`` says, a layer that the kernel choice computes densely
(``kernel="dense"``, or ``"auto"`` on small CPU layers: `dcjax.kernels.auto`)
keeps no cache and gets no test: it has nothing to reuse. Refined layers tell
``kernel="auto"`` that their masks are scattered at pixel level, which picks
pixel-granular kernels (`dcjax.kernels.rows`) for them on CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from dcjax.transforms.records import DenseLayer, Layer
from dcjax.transforms.spatial import Spatial

__all__ = [
    "AUTO_MIN_DENSE_OUTPUTS",
    "AUTO_MIN_DENSE_WEIGHTS",
    "AUTO_MIN_MACS_PER_INPUT",
    "DENSE_FRACTION",
    "DENSE_REANCHOR_EVERY",
    "METRICS",
    "auto_dense",
    "change",
    "dense_error_bound",
    "dense_scale",
    "error_bound",
    "refined_dense",
    "reanchors",
    "refined_layers",
    "scale",
]

#: The per-pixel change metrics (`RefineConfig.metric`).
METRICS = ("max_abs", "rms")

#: Multiply-adds per input element from which "auto" refines a convolution.
AUTO_MIN_MACS_PER_INPUT = 160

#: Fully connected layers with fewer weights are not refined under "auto".
AUTO_MIN_DENSE_WEIGHTS = 1 << 22

#: Nor are those with fewer outputs (weight values read per changed input).
AUTO_MIN_DENSE_OUTPUTS = 16

#: A fully connected layer with more of its inputs changed than this computes
#: its product in full (`dcjax.kernels.matvec`; see docs/performance-notes.md,
#: "Fully connected layers: the full product above 75 % changed inputs").
DENSE_FRACTION = 0.75

#: Every this many frames a fully connected layer updated by rows computes its
#: product in full again, so that the float32 rounding of the updates does not
#: grow without bound (see docs/performance-notes.md, "Fully connected layers:
#: re-anchoring the running product").
DENSE_REANCHOR_EVERY = 64


def reanchors(frame_index: jax.Array, layer: int) -> jax.Array:
    """Whether fully connected layer ``layer`` computes its product in full on
    frame ``frame_index`` (`DENSE_REANCHOR_EVERY`, staggered by layer)."""
    return (frame_index + layer) % DENSE_REANCHOR_EVERY == 0


def refined_layers(
    layers: Sequence[Layer],
    config: Any,
    dense_layers: Sequence[DenseLayer] = (),
    reads_frame: Sequence[bool] = (),
    matcher: bool = True,
) -> tuple[bool, ...]:
    """Which convolutions get the change test under ``config.layers`` (``config``: a
    `dcjax.RefineConfig`; this module reads its ``layers`` alone).

    ``dense_layers`` are the model's fully connected layers: names in
    ``config.layers`` may name them too (`refined_dense`). ``reads_frame``
    flags the layers whose input is the frame (with no reused layer in
    between); ``"auto"`` refines them exactly when no block matcher runs
    (``matcher`` false): with one, its test decides reuse on that input;
    without one, their test is the only reuse at the input, whatever it costs.
    """
    if config.layers == "all":
        return tuple(True for _ in layers)
    if config.layers == "auto":
        flags = tuple(reads_frame) or (False,) * len(layers)
        return tuple(
            not matcher
            if on_frame
            else layer.kernel[0] * layer.kernel[1] * layer.out_channels / layer.groups
            >= AUTO_MIN_MACS_PER_INPUT * layer.strides[0] * layer.strides[1]
            for layer, on_frame in zip(layers, flags, strict=True)
        )
    names = set(config.layers)
    known = [layer.name for layer in layers] + [d.name for d in dense_layers]
    unknown = names - set(known)
    if unknown:
        raise ValueError(
            f"dcjax: RefineConfig.layers names unknown layers {sorted(unknown)}; "
            f"the model's layers are {known}"
        )
    return tuple(layer.name in names for layer in layers)


def refined_dense(dense_layers: Sequence[DenseLayer], config: Any) -> tuple[bool, ...]:
    """Which fully connected layers are updated by their changed inputs' rows.

    Under ``"auto"`` those with at least `AUTO_MIN_DENSE_WEIGHTS` weights and
    `AUTO_MIN_DENSE_OUTPUTS` outputs, under ``"all"`` every one, else those
    named (see the module docstring).
    """
    if config.layers == "all":
        return tuple(True for _ in dense_layers)
    if config.layers == "auto":
        return auto_dense(dense_layers)
    return tuple(d.name in config.layers for d in dense_layers)


def auto_dense(dense_layers: Sequence[DenseLayer]) -> tuple[bool, ...]:
    """The fully connected layers worth updating by rows: at least
    `AUTO_MIN_DENSE_WEIGHTS` weights and `AUTO_MIN_DENSE_OUTPUTS` outputs
    (``layers="auto"``, and plain DeepCache's exact updates,
    ``Config.dense_updates``)."""
    return tuple(
        d.out_features >= AUTO_MIN_DENSE_OUTPUTS
        and d.in_features * d.out_features >= AUTO_MIN_DENSE_WEIGHTS
        for d in dense_layers
    )


def _per_pixel(d: jax.Array, sig: Spatial, metric: str) -> jax.Array:
    """Reduce every non-spatial axis: (..., H, ..., W, ...) -> (H, W)."""
    axes = tuple(i for i in range(d.ndim) if i not in sig.axes)
    if metric == "max_abs":
        out = jnp.max(jnp.abs(d), axis=axes)
    else:
        out = jnp.sqrt(jnp.mean(jnp.square(d), axis=axes))
    return out.T if sig.axes[0] > sig.axes[1] else out


def change(x: jax.Array, ref: jax.Array, sig: Spatial, metric: str) -> jax.Array:
    """Per-pixel change of ``x`` against ``ref`` over channels, (H, W)."""
    return _per_pixel(x.astype(jnp.float32) - ref.astype(jnp.float32), sig, metric)


def scale(x: jax.Array, sig: Spatial, metric: str) -> jax.Array:
    """The layer's activation scale: mean per-pixel magnitude of ``x``."""
    return jnp.mean(_per_pixel(x.astype(jnp.float32), sig, metric))


def dense_scale(x: jax.Array) -> jax.Array:
    """A fully connected layer's activation scale: the mean ``|x|`` of its input."""
    return jnp.mean(jnp.abs(x.astype(jnp.float32)))


def dense_error_bound(w: jax.Array, threshold: jax.Array) -> jax.Array:
    """Bound on |refined product - x_t @ W| per output, for ``(K, N)`` weights."""
    return threshold * jnp.abs(w.astype(jnp.float32)).sum(axis=0)


def error_bound(w: jax.Array, threshold: jax.Array, metric: str, cin: int) -> jax.Array:
    """Bound on |reused output - conv(x_t)| per output channel (HWIO weights).

    Args:
        w: (kh, kw, C_in / groups, C_out) weights.
        threshold: the layer's ``delta_l``.
        metric: ``"max_abs"`` or ``"rms"``.
        cin: the layer's input channels (all of them, for "rms").
    """
    w = jnp.abs(w.astype(jnp.float32))
    if metric == "max_abs":
        per_channel = w.sum(axis=(0, 1, 2))
    else:
        per_channel = jnp.sqrt(jnp.square(w).sum(axis=2)).sum(axis=(0, 1)) * jnp.sqrt(cin)
    return 2.0 * threshold * per_channel
