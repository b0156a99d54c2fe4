"""How XLA computes a convolution over a batch of tiles, per layer shape.

Contract: `valid_conv` and `dense_conv` equal `lax.conv_general_dilated`
(VALID on pre-padded windows, and with the layer's padding, respectively) up
to fp rounding, whichever lowering computes them. The lowerings
(`LOWERINGS`; `lowerings(p)` lists those that apply to a layer) rewrite the
shapes XLA:CPU's convolution runs slowly: ``"dot"`` a matrix product of
patches (`conv_as_dot`), ``"taps"`` a sum over kernel taps (depthwise layers,
and ungrouped ones on at most `TAPS_MAX_TERMS` inputs per output) of a padded
input's slices, ``"edges"`` the same sum of slices of the unpadded input, each
zero-extended to the output (depthwise layers over whole maps: no padded copy
of the input; `edges_pays`; `chosen` gives it only for a ``materialized``
input, since XLA fuses an elementwise producer into each tap),
``"groups"`` one convolution per group, ``"rgb"`` a zero fourth input
channel; ``"conv"`` is XLA's own convolution.

Which lowering a layer takes (`chosen`): over the whole map (`dense_conv`:
the dense step, the masked kernels' dense paths, a layer computed in full),
the one its model chose, while the model is traced inside `use` (the
transform passes the choices its measurements kept, which time whole maps:
`dcjax.lowerings.measure_lowerings`); else, and always on a batch of tile
windows (`valid_conv` in the tile and chain kernels), `prior`, the rules
measured once on a 2-core machine (the ``*_pays`` predicates,
docs/performance-notes.md; ``"conv"`` off CPU). `dcjax.transforms.lowering`
does the same for the primitives that are not convolutions.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping

import jax
import jax.numpy as jnp
from jax import lax

from dcjax.kernels import tiles as _tiles
from dcjax.kernels.reference import DIMENSION_NUMBERS

__all__ = [
    "LOWERINGS",
    "TAPS_MAX_COUT",
    "TAPS_MAX_TERMS",
    "choice_key",
    "choices",
    "chosen",
    "conv_as_dot",
    "dense_conv",
    "dot_pays",
    "edges_pays",
    "group_weights",
    "lowerings",
    "prior",
    "rgb_pays",
    "taps_pays",
    "use",
    "valid_conv",
]

#: The ways `dense_conv` and `valid_conv` compute a convolution (module docstring).
LOWERINGS: tuple[str, ...] = ("conv", "dot", "taps", "edges", "groups", "rgb")

#: The lowerings in force while a model is traced: `choice_key` -> lowering
#: (`use`); None outside, where `prior` decides.
_CHOICES: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar(
    "dcjax_lowerings", default=None
)


def lowerings(p: _tiles.TilePlan) -> tuple[str, ...]:
    """The lowerings that can compute the layer ``p``: ``"conv"`` always; an
    ungrouped layer also ``"dot"``, ``"rgb"`` on 3 input channels and
    ``"taps"`` with a kernel larger than 1x1 on at most `TAPS_MAX_TERMS` inputs
    per output; a depthwise layer (one input channel per group) ``"taps"`` and
    ``"edges"``, another grouped one ``"groups"``."""
    if p.groups > 1:
        return ("conv", "taps", "edges") if p.cin == p.groups else ("conv", "groups")
    out = ["conv", "dot"]
    if p.kh * p.kw > 1 and p.kh * p.kw * p.cin <= TAPS_MAX_TERMS:
        out.append("taps")
    if p.cin == 3:
        out.append("rgb")
    return tuple(out)


def prior(p: _tiles.TilePlan) -> str:
    """The lowering of ``p`` by the fixed rules: on CPU a grouped layer's own
    (``"edges"`` where `edges_pays`, else ``"taps"`` or ``"groups"``), else
    ``"taps"``, ``"dot"`` or ``"rgb"`` where `taps_pays`, `dot_pays` or
    `rgb_pays` says so, else ``"conv"``; ``"conv"`` on other backends."""
    if jax.default_backend() != "cpu":
        return "conv"
    if p.groups > 1:
        return "edges" if edges_pays(p) else lowerings(p)[1]
    if taps_pays(p):
        return "taps"
    if dot_pays(p):
        return "dot"
    return "rgb" if rgb_pays(p) else "conv"


def choice_key(p: _tiles.TilePlan, dtype=jnp.float32) -> str:
    """What a lowering choice is kept under: the layer's geometry and dtype,
    whatever its batch (pooled streams take the choice of one stream)."""
    return _tiles.layer_key(dataclasses.replace(p, n=1), dtype)


def choices(pairs: Iterable[tuple[_tiles.TilePlan, str]], dtype=jnp.float32) -> dict[str, str]:
    """A mapping for `use`: each layer ``p`` computed by its lowering ``how``."""
    out = {}
    for p, how in pairs:
        if how not in lowerings(p):
            raise ValueError(
                f"dcjax: lowering {how!r} cannot compute {_tiles.layer_key(p, dtype)}; "
                f"one of {lowerings(p)}"
            )
        out[choice_key(p, dtype)] = how
    return out


@contextlib.contextmanager
def use(mapping: Mapping[str, str]) -> Iterator[None]:
    """Within the block, a layer computed over its whole map whose `choice_key`
    is in ``mapping`` is traced with that lowering (`chosen`); every other
    with `prior`. A context variable: each thread (and each `contextvars`
    context) has its own."""
    token = _CHOICES.set(mapping)
    try:
        yield
    finally:
        _CHOICES.reset(token)


def chosen(
    p: _tiles.TilePlan, dtype=jnp.float32, *, whole: bool = True, materialized: bool = True
) -> str:
    """The lowering of the layer ``p`` at ``dtype``: over its whole map
    (``whole``), the current `use` block's choice, else `prior`; on tile
    windows (``whole=False``), `prior`: the measured choices time whole maps,
    and a window batch is another shape (with the measured choices on its
    windows too, MobileNetV2's streams at 576x768 ran slower:
    docs/performance-notes.md). ``"edges"`` only for an input that is
    ``materialized`` (a buffer, such as a kernel's operand), else ``"taps"``:
    XLA:CPU fuses an elementwise producer of the input into each of its
    slices, where ``"taps"`` fuses it into the one padded copy."""
    current = _CHOICES.get() if whole else None
    how = (current or {}).get(choice_key(p, dtype)) or prior(p)
    return "taps" if how == "edges" and not materialized else how


def group_weights(w: jax.Array, p: _tiles.TilePlan, how: str) -> jax.Array | tuple:
    """``w``, or its per-group slices where `valid_conv` convolves group by group
    (lowering ``how`` is ``"groups"``).

    The tile kernel calls it in `sparse_or_dense`'s ``prepare``, once a frame
    and only when the sparse path runs: sliced inside the sparse loop the
    weights were copied on every step, and sliced in a loop of their own they
    needed a zero-filled placeholder (docs/performance-notes.md, "Grouped
    weights are sliced once a frame, around the sparse loop (group_weights)").
    """
    g, cig = p.groups, w.shape[2]
    if not (how == "groups" and g > 1 and cig > 1):
        return w
    cog = p.cout // g
    return tuple(w[..., i * cog : (i + 1) * cog] for i in range(g))


def valid_conv(x: jax.Array, w: jax.Array | tuple, p: _tiles.TilePlan, how: str) -> jax.Array:
    """VALID convolution of ``x`` with the plan's strides, dilation and groups,
    by the lowering ``how`` (`LOWERINGS`).

    ``"taps"``: a depthwise layer (one input channel per group) as a sum over
    kernel taps of strided slices times per-channel weights, an ungrouped one
    as a sum over taps and input channels of a slice's channel times its row
    of weights (accumulated in float32 at least); ``"groups"``: one
    convolution per group, concatenated; ``"rgb"``: with a zero fourth input
    channel; ``"conv"``: XLA's convolution; ``"dot"`` has no VALID form here:
    a sum of taps, a zero fourth channel or XLA's convolution, as `taps_pays`
    and `rgb_pays` say; ``"edges"`` is ``"taps"`` here (windows are padded
    already). Same result as `lax.conv_general_dilated` up to fp
    rounding.
    ``w`` may be `group_weights`' per-group slices.
    """
    g = p.groups
    if isinstance(w, tuple):
        return _per_group(x, w, p)
    if how == "dot":  # no VALID form of its own: the fixed rules' for windows
        how = "taps" if taps_pays(p) else "rgb" if rgb_pays(p) else "conv"
    if how == "edges":  # pre-padded windows have no padding to leave out
        how = "taps"
    cig = w.shape[2]
    if how == "taps" and g > 1 and cig == 1:
        mult = p.cout // g
        if mult > 1:
            x = jnp.repeat(x, mult, axis=-1)
        out_dtype = jnp.result_type(x.dtype, w.dtype)
        return _tap_sum(
            x, p, lambda sl, ky, kx: sl.astype(out_dtype) * w[ky, kx, 0].astype(out_dtype)
        )
    if how == "taps" and g == 1:
        out_dtype = jnp.result_type(x.dtype, w.dtype)
        acc = jnp.promote_types(out_dtype, jnp.float32)  # as a convolution accumulates

        def term(sl, ky, kx):  # (..., 1) input channel times its (Cout,) weights
            parts = [sl[..., c : c + 1].astype(acc) * w[ky, kx, c].astype(acc)
                     for c in range(p.cin)]  # fmt: skip
            return functools.reduce(operator.add, parts)

        return _tap_sum(x, p, term).astype(out_dtype)
    if how == "groups" and g > 1:
        return _per_group(x, group_weights(w, p, how), p)
    if how == "rgb" and g == 1:
        x, w = _rgb_padded(x, w)
    return lax.conv_general_dilated(
        x,
        w,
        window_strides=p.strides,
        padding="VALID",
        rhs_dilation=p.dilation,
        dimension_numbers=DIMENSION_NUMBERS,
        feature_group_count=g,
    )


def _tap_sum(x: jax.Array, p: _tiles.TilePlan, term: Callable[..., jax.Array]) -> jax.Array:
    """``sum over taps (ky, kx) of term(slice, ky, kx)``: a VALID convolution of
    ``x`` written as elementwise terms, ``slice`` the tap's strided (and
    dilated) view of ``x`` with the output's spatial shape. XLA fuses the sum
    into one pass over the output."""
    (sy, sx), (dy, dx) = p.strides, p.dilation
    n, hh, ww, c = x.shape
    oh = (hh - (p.kh - 1) * dy - 1) // sy + 1
    ow = (ww - (p.kw - 1) * dx - 1) // sx + 1
    acc = None
    for ky in range(p.kh):
        for kx in range(p.kw):
            sl = lax.slice(
                x,
                (0, ky * dy, kx * dx, 0),
                (n, ky * dy + (oh - 1) * sy + 1, kx * dx + (ow - 1) * sx + 1, c),
                (1, sy, sx, 1),
            )
            t = term(sl, ky, kx)
            acc = t if acc is None else acc + t
    return acc


def _edge_taps(x: jax.Array, w: jax.Array, p: _tiles.TilePlan) -> jax.Array:
    """A depthwise convolution with the layer's padding as ``sum over taps of
    w[tap] * zero-extended slice of x``: each tap's strided slice covers the
    outputs whose input lies inside ``x`` and is padded with zeros to the
    output's shape, which XLA fuses into the one pass over the output, so no
    padded copy of ``x`` is made (``"edges"``); summed in float32 at least."""
    (sy, sx), (dy, dx) = p.strides, p.dilation
    (ply, _), (plx, _) = p.pads
    mult = p.cout // p.groups
    if mult > 1:
        x = jnp.repeat(x, mult, axis=-1)
    out_dtype = jnp.result_type(x.dtype, w.dtype)
    acc_dtype = jnp.promote_types(out_dtype, jnp.float32)  # as a convolution accumulates
    n, h, ww, c = x.shape
    acc = jnp.zeros((n, p.ho, p.wo, c), acc_dtype)
    for ky in range(p.kh):
        y0, y1 = _inside(ky * dy - ply, sy, p.ho, h)
        for kx in range(p.kw):
            x0, x1 = _inside(kx * dx - plx, sx, p.wo, ww)
            if y0 >= y1 or x0 >= x1:
                continue  # the tap reads padding only
            sl = lax.slice(
                x,
                (0, y0 * sy + ky * dy - ply, x0 * sx + kx * dx - plx, 0),
                (n, (y1 - 1) * sy + ky * dy - ply + 1, (x1 - 1) * sx + kx * dx - plx + 1, c),
                (1, sy, sx, 1),
            )
            zero = jnp.zeros((), x.dtype)
            sl = lax.pad(sl, zero, ((0, 0, 0), (y0, p.ho - y1, 0), (x0, p.wo - x1, 0), (0, 0, 0)))
            acc = acc + sl.astype(acc_dtype) * w[ky, kx, 0].astype(acc_dtype)
    return acc.astype(out_dtype)


def _inside(offset: int, stride: int, n_out: int, n_in: int) -> tuple[int, int]:
    """Outputs ``[lo, hi)`` whose input ``o * stride + offset`` lies in ``[0, n_in)``."""
    lo = max(0, -(offset // stride))  # ceil(-offset / stride)
    hi = min(n_out, max(lo, -(-(n_in - offset) // stride)))
    return lo, hi


def _per_group(x: jax.Array, ws: tuple, p: _tiles.TilePlan) -> jax.Array:
    """One VALID convolution per group (weights ``ws``), concatenated."""
    cig = ws[0].shape[2]
    parts = [
        lax.conv_general_dilated(
            x[..., i * cig : (i + 1) * cig],
            wi,
            window_strides=p.strides,
            padding="VALID",
            rhs_dilation=p.dilation,
            dimension_numbers=DIMENSION_NUMBERS,
        )
        for i, wi in enumerate(ws)
    ]
    return jnp.concatenate(parts, axis=-1)


def dot_pays(p: _tiles.TilePlan) -> bool:
    """Whether XLA:CPU runs ungrouped convolution ``p`` faster as `conv_as_dot`:
    every 1x1 convolution, and those on maps of at most 64 output pixels with
    at least 128 input channels.

    XLA:CPU's convolution (YNNPACK) is slow where the weight matrix is large
    against the map (docs/performance-notes.md, "Ungrouped 1x1 convolutions and
    small maps as a matrix product on CPU (dot_pays)").
    """
    if p.groups != 1:
        return False
    if p.kh * p.kw == 1:
        return True
    return p.ho * p.wo <= 64 and p.cin >= 128


def rgb_pays(p: _tiles.TilePlan) -> bool:
    """Whether XLA:CPU runs ungrouped convolution ``p`` faster with a fourth,
    zero input channel (`_rgb_padded`): 3 input channels and 17-32 outputs.

    XLA:CPU's convolution (YNNPACK) takes a slow path for 3-channel inputs with
    17 to 32 output channels (docs/performance-notes.md, "RGB inputs with 17-32
    outputs get a zero fourth channel on CPU (rgb_pays)").
    """
    return p.groups == 1 and p.cin == 3 and 16 < p.cout <= 32


#: Most multiply-adds per output value (``kh * kw * Cin``) of a convolution
#: that `taps_pays` computes as a sum of taps (3x3 on RGB).
TAPS_MAX_TERMS = 27

#: Most output channels of a convolution that `taps_pays` computes as a sum of
#: taps (docs/performance-notes.md, "3x3 RGB convolutions to at most 16 outputs
#: as a sum of taps on CPU (taps_pays)").
TAPS_MAX_COUT = 16


def edges_pays(p: _tiles.TilePlan) -> bool:
    """Whether XLA:CPU runs depthwise layer ``p`` over its whole map faster by
    ``"edges"`` than by ``"taps"``: a stride above 1 (the fixed rules, which
    tile windows follow too, where ``"edges"`` computes what ``"taps"`` does). A strided sum of taps
    reads its input with gaps either way, and the padded copy ``"taps"`` makes
    first is most of its time; at stride 1 the bounds tests inside the fused
    pass cost more than the copy (docs/performance-notes.md, "Strided
    depthwise layers without a padded copy (edges_pays)"). Measured on an
    input in a buffer of its own: `chosen` gives ``"taps"`` instead where the
    input is an elementwise producer's."""
    return p.groups > 1 and p.cin == p.groups and max(p.strides) > 1


def taps_pays(p: _tiles.TilePlan) -> bool:
    """Whether XLA:CPU runs ungrouped convolution ``p`` faster as a fused sum
    of ``kh * kw * Cin`` elementwise terms (`valid_conv`'s tap path, summed in
    float32 at least): a kernel larger than 1x1 on at most `TAPS_MAX_TERMS`
    input values per output (3x3 on RGB; also 5x5 on one channel or 3x3 on
    two) with at most `TAPS_MAX_COUT` output channels.

    XLA:CPU's convolution (YNNPACK) is slow on RGB inputs with few output
    channels; larger kernels lose as a sum of taps, and 1x1 convolutions are
    matrix products (`dot_pays`). See docs/performance-notes.md, "3x3 RGB
    convolutions to at most 16 outputs as a sum of taps on CPU (taps_pays)".
    """
    return (
        p.groups == 1
        and p.kh * p.kw > 1
        and p.kh * p.kw * p.cin <= TAPS_MAX_TERMS
        and p.cout <= TAPS_MAX_COUT
    )


def _rgb_padded(x: jax.Array, w: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``x`` and ``w`` with a zero fourth input channel: the same convolution."""
    x = jnp.pad(x, ((0, 0),) * 3 + ((0, 1),))
    return x, jnp.pad(w, ((0, 0), (0, 0), (0, 1), (0, 0)))


def conv_as_dot(x: jax.Array, w: jax.Array, p: _tiles.TilePlan) -> jax.Array:
    """An ungrouped convolution as one matrix product of the input's patches.

    The padded input's ``kh * kw`` strided (and dilated) slices, concatenated
    along the channels, are the rows of an ``(N Ho Wo, kh kw Cin)`` matrix; the
    weights reshaped to ``(kh kw Cin, Cout)`` multiply it. Same result as
    `lax.conv_general_dilated` up to fp rounding.
    """
    xp = _tiles.pad_input(x, p)
    (sy, sx), (dy, dx) = p.strides, p.dilation
    n = xp.shape[0]
    taps = [
        lax.slice(
            xp,
            (0, ky * dy, kx * dx, 0),
            (n, ky * dy + (p.ho - 1) * sy + 1, kx * dx + (p.wo - 1) * sx + 1, p.cin),
            (1, sy, sx, 1),
        )
        for ky in range(p.kh)
        for kx in range(p.kw)
    ]
    cols = taps[0] if len(taps) == 1 else jnp.concatenate(taps, axis=-1)
    rows = cols.reshape(n * p.ho * p.wo, p.kh * p.kw * p.cin)
    out = rows @ w.reshape(p.kh * p.kw * p.cin, p.cout)
    return out.reshape(n, p.ho, p.wo, p.cout)


def dense_conv(x: jax.Array, w: jax.Array, p: _tiles.TilePlan, how: str | None = None) -> jax.Array:
    """The whole convolution by the lowering ``how`` (default: `chosen` for
    ``p`` and the operands' dtype): ``"dot"`` as `conv_as_dot`, ``"taps"`` and
    ``"groups"`` by `valid_conv` on the padded input, ``"edges"`` (depthwise
    layers) as zero-extended slices of the unpadded input, ``"rgb"`` with a
    zero fourth input channel, ``"conv"`` as XLA's convolution."""
    out_dtype = jnp.result_type(x.dtype, w.dtype)
    how = chosen(p, out_dtype) if how is None else how
    if how == "edges":  # `lowerings` offers it for depthwise layers only
        return _edge_taps(x, w, p).astype(out_dtype)
    if how in ("taps", "groups"):
        return valid_conv(_tiles.pad_input(x, p), w, p, how).astype(out_dtype)
    if how == "dot":
        return conv_as_dot(x, w, p).astype(out_dtype)
    if how == "rgb":
        x, w = _rgb_padded(x, w)
    return lax.conv_general_dilated(
        x,
        w,
        window_strides=p.strides,
        padding=p.pads,
        rhs_dilation=p.dilation,
        dimension_numbers=DIMENSION_NUMBERS,
        feature_group_count=p.groups,
    ).astype(out_dtype)
