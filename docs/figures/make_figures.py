"""Make the figures of docs/how-reuse-works.md (run by hand, not by the tests).

From the repository root::

    python docs/figures/make_figures.py            # every figure
    python docs/figures/make_figures.py erosion    # some of them

It writes PNG files next to itself (docs/figures/). Every figure is computed
with dcjax's own functions on the bundled clips (``vtest``: fixed camera;
``box``: handheld, with a still opening). The zoo models have random weights
(only EfficientNet-Lite0 and MobileNetV2 ship real ones), which changes their values but
not their reuse masks: masks depend on the frames, the motion and the
layers' geometry only. ResNet-50 is built at a quarter of its width for the
same reason (the masks do not depend on the number of channels). Takes a few
minutes on a 2-core CPU, most of it compiling.
"""

from __future__ import annotations

import io
import pathlib
import sys

import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402
from PIL import Image  # noqa: E402

from dcjax import deepcache, kernels, matching, models, video  # noqa: E402
from dcjax.transforms import (  # noqa: E402
    Spatial,
    analyze,
    refine,  # noqa: E402
    trace_model,
)
from dcjax.transforms.interpreter import propagate_masks  # noqa: E402
from dcjax.transforms.motion import FrameContext  # noqa: E402

OUT = pathlib.Path(__file__).resolve().parent
SIZE = (224, 224)
#: reusable (green) / recomputed (red), as in notebooks/02_region_propagation_alexnet.py
MASK_CMAP = ListedColormap(["#d7301f", "#a6d96a"])
RED, GREEN, GREY = "#d7301f", "#a6d96a", "#bdbdbd"


def save(fig, name: str) -> None:
    """Write ``fig`` as a palette PNG (small files for the repository)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    img = Image.open(buf).convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT)
    path = OUT / f"{name}.png"
    img.save(path, optimize=True)
    print(f"wrote {path.relative_to(OUT.parent.parent)} ({path.stat().st_size // 1024} KB)")


def clip(name: str, count: int, size=SIZE, start: int = 0) -> np.ndarray:
    frames = video.read(video.clip_path(name), size=size, max_frames=start + count)
    return np.stack([f for i, f in enumerate(frames) if i >= start])


def overlay(ax, frame, mask, title: str) -> None:
    """``frame`` with its recomputed pixels (``~mask``) tinted red."""
    ax.imshow(frame)
    tint = np.zeros((*mask.shape, 4))
    tint[~mask] = (0.84, 0.19, 0.12, 0.55)
    ax.imshow(tint, interpolation="nearest")
    ax.set_title(title, fontsize=8)
    ax.axis("off")


def show_mask(ax, mask, title: str) -> None:
    ax.imshow(mask, cmap=MASK_CMAP, vmin=0, vmax=1, interpolation="nearest")
    ax.set_title(title, fontsize=8)
    ax.set_xticks([])
    ax.set_yticks([])


class Masks:
    """Every spatial variable's reuse mask in one model, by `propagate_masks`."""

    def __init__(self, name: str, **create) -> None:
        self.name = name
        self.shape = models.input_shape(name)
        module, variables = models.create(name, **create)
        self.traced = trace_model(module, variables, self.shape)
        n = len(self.traced.leaves)
        frame = Spatial(axes=(1, 2), size=self.shape[:2], stride=(1, 1))
        self.analysis = analyze(self.traced.jaxpr, [None] * n + [frame], [False] * n + [True])
        self.sigs: dict = {}
        self._run = {}

    def eqn(self, path):
        a = self.analysis
        for i in path[:-1]:
            a = a.eqns[i].sub
        return a.jaxpr.jaxpr.eqns[path[-1]]

    def __call__(self, frame, r0, motion=(0, 0), alignment="exact") -> dict:
        """``{(path, var): (value, mask)}`` for ``frame`` with input mask ``r0``."""
        if alignment not in self._run:

            def run(leaves, x, r0, motion):
                ctx = FrameContext(motion, alignment)
                n = len(leaves)
                _, rec = propagate_masks(self.analysis, [*leaves, x], [True] * n + [r0], ctx)
                out = {}
                for key, (sig, value, mask) in rec.items():
                    self.sigs[key] = sig
                    out[key] = (value, jnp.broadcast_to(jnp.asarray(mask), sig.size))
                return out

            self._run[alignment] = jax.jit(run)
        x = models.preprocess(self.name, jnp.asarray(frame))[None]
        out = self._run[alignment](
            self.traced.leaves, x, jnp.asarray(r0), jnp.asarray(motion, jnp.int32)
        )
        return {k: (np.asarray(v), np.asarray(m)) for k, (v, m) in out.items()}

    def find(self, rec: dict, scope: str, primitive: str | None = None):
        """The last recorded variable made in name scope ``scope`` (by ``primitive``)."""
        hits = [
            k
            for k in rec
            if str(self.eqn(k[0]).source_info.name_stack) == scope
            and (primitive is None or self.eqn(k[0]).primitive.name == primitive)
        ]
        if not hits:
            raise KeyError(f"{self.name}: nothing recorded in scope {scope!r}")
        return hits[-1]


_RESNET: Masks | None = None


def resnet() -> Masks:
    global _RESNET
    if _RESNET is None:
        _RESNET = Masks("resnet50", width=0.25)
    return _RESNET


# -- 1. the matcher ----------------------------------------------------------------------


def fig_matcher() -> None:
    """vtest's reuse mask, and a camera pan over a vtest frame with its block vectors."""
    f = clip("vtest", 2)
    m = matching.match(jnp.asarray(f[0]), jnp.asarray(f[1]), block_size=10, psnr_threshold=20.0)
    full = next(iter(video.read(video.clip_path("vtest"), max_frames=1)))
    pan = video.camera_motion(2, SIZE, image=full, pan=(4, -6))
    p = matching.match(
        jnp.asarray(pan.frames[0]), jnp.asarray(pan.frames[1]), block_size=10, psnr_threshold=20.0
    )
    fig, ax = plt.subplots(1, 4, figsize=(12, 3.3))
    ax[0].imshow(f[1])
    ax[0].set_title("vtest, frame 1 (fixed camera)", fontsize=8)
    ax[0].axis("off")
    overlay(
        ax[1], f[1], np.asarray(m.mask),
        f"its reuse mask R0 against frame 0\nmotion {tuple(np.asarray(m.motion).tolist())}, "
        f"{float(m.match_ratio):.0%} of 10x10 blocks matched",
    )  # fmt: skip
    ax[2].imshow(pan.frames[1])
    v = np.asarray(p.block_vectors)
    ys, xs = np.mgrid[0 : v.shape[0], 0 : v.shape[1]] * 10 + 5
    at = (v == np.asarray(p.motion)).all(-1)
    for sel, color in ((at, "yellow"), (~at, "cyan")):
        ax[2].quiver(
            xs[sel], ys[sel], v[sel][:, 1], v[sel][:, 0], color=color, angles="xy",
            scale_units="xy", scale=0.8, width=0.004,
        )  # fmt: skip
    ax[2].set_title(
        f"a camera pan over a vtest frame: each block's\nbest vector (yellow: the global "
        f"motion, {at.mean():.0%})",
        fontsize=8,
    )
    ax[2].axis("off")
    overlay(
        ax[3], pan.frames[1], np.asarray(p.mask),
        f"global motion {tuple(np.asarray(p.motion).tolist())} "
        f"(true {tuple(pan.motion[1].tolist())}):\nthe uncovered strips are recomputed",
    )  # fmt: skip
    save(fig, "matcher")


# -- 2. cache erosion ---------------------------------------------------------------------

EROSION = [
    ("ResNet50/stem/conv", "conv_general_dilated", "stem conv 7x7/2"),
    ("ResNet50", "reduce_window_max", "max pool 3x3/2"),
    ("ResNet50/layer1_2", "add", "end of layer1"),
    ("ResNet50/layer2_1", "add", "layer2, block 2"),
    ("ResNet50/layer2_3", "add", "end of layer2"),
    ("ResNet50/layer3_0", "add", "layer3, block 1"),
    ("ResNet50/layer3_2", "add", "layer3, block 3"),
]


def fig_erosion() -> None:
    """The matcher's mask on vtest and what is left of it, layer after layer of ResNet-50."""
    net = resnet()
    f = clip("vtest", 2)
    m = matching.match(jnp.asarray(f[0]), jnp.asarray(f[1]), block_size=10, psnr_threshold=20.0)
    r0 = np.asarray(m.mask)
    rec = net(f[1], r0)
    panels = [("input R0, 224x224", r0)]
    for scope, prim, label in EROSION:
        key = net.find(rec, scope, prim)
        mask = rec[key][1]
        panels.append((f"{label}, {mask.shape[0]}x{mask.shape[1]}", mask))
    fig, ax = plt.subplots(2, 4, figsize=(10, 5.6))
    for a, (label, mask) in zip(ax.ravel(), panels, strict=True):
        show_mask(a, mask, f"{label}\n{mask.mean():.0%} reusable")
    fig.suptitle("Cache erosion: ResNet-50 on vtest frames 0 -> 1 (green: reusable)", fontsize=10)
    save(fig, "erosion")


# -- 3. shifted caches and alignment ------------------------------------------------------

STRIDES = [
    (None, None, "input, stride 1"),
    ("ResNet50/stem/conv", "conv_general_dilated", "stem conv, stride 2"),
    ("ResNet50/layer1_2", "add", "layer1, stride 4"),
    ("ResNet50/layer2_3", "add", "layer2, stride 8"),
    ("ResNet50/layer3_5", "add", "layer3, stride 16"),
    ("ResNet50/layer4_2", "add", "layer4, stride 32"),
]


def fig_alignment(pan_x: int = 4) -> None:
    """A pan of ``pan_x`` pixels: the shift each stride sees, under both alignment policies.

    The match is the synthetic clip's ground truth (a step accepts a known `Match`):
    the masks show the shifts, not the matcher.
    """
    net = resnet()
    full = next(iter(video.read(video.clip_path("vtest"), max_frames=1)))
    pan = video.camera_motion(2, SIZE, image=full, pan=(0, pan_x))
    motion = tuple(int(d) for d in pan.motion[1])
    r0 = pan.reusable[1]
    fig, ax = plt.subplots(2, len(STRIDES), figsize=(13, 5.2))
    for row, alignment in enumerate(("exact", "round")):
        rec = net(pan.frames[1], r0, motion, alignment)
        for col, (scope, prim, label) in enumerate(STRIDES):
            mask = r0 if scope is None else rec[net.find(rec, scope, prim)][1]
            shift = motion[1] / 2**col
            if alignment == "exact":
                note = f"shift {shift:g}" if shift == int(shift) else f"{shift:g}: not whole"
            else:
                note = f"{shift:g} -> {int(np.floor(shift + 0.5))}"
            show_mask(
                ax[row, col], mask, f"{label}\n{alignment}: {note}\n{mask.mean():.0%} reusable"
            )
    fig.suptitle(
        f"A camera pan, motion {motion}: a map of stride s shifts its cache by M / s",
        fontsize=10,
    )
    save(fig, "alignment")


# -- 4. dirty tiles and dirty rows --------------------------------------------------------


def fig_tiles() -> None:
    """One layer's output mask as the tile kernel and the row kernel see it."""
    net = resnet()
    f = clip("vtest", 2)
    m = matching.match(jnp.asarray(f[0]), jnp.asarray(f[1]), block_size=10, psnr_threshold=20.0)
    rec = net(f[1], np.asarray(m.mask))
    mask = rec[net.find(rec, "ResNet50/layer1_2/conv2/conv", "conv_general_dilated")][1]
    h, w = mask.shape
    th, tw = kernels.default_tile(h, w)
    nty, ntx = -(-h // th), -(-w // tw)
    fresh = np.zeros((nty * th, ntx * tw), bool)
    fresh[:h, :w] = ~mask
    dirty = fresh.reshape(nty, th, ntx, tw).any(axis=(1, 3))
    tile_fraction = float(kernels.dirty_fraction(jnp.asarray(mask)[None], tile=(th, tw)))
    assert abs(tile_fraction - dirty.mean()) < 1e-6, (tile_fraction, dirty.mean())

    fig, ax = plt.subplots(1, 3, figsize=(11, 3.9))
    show_mask(ax[0], mask, f"its reuse mask, {h}x{w}\n{mask.mean():.0%} of pixels reusable")
    ax[1].imshow(np.where(mask, 1, 0), cmap=MASK_CMAP, vmin=0, vmax=1, interpolation="nearest")
    for ty, tx in zip(*np.nonzero(dirty), strict=True):
        ax[1].add_patch(
            Rectangle((tx * tw - 0.5, ty * th - 0.5), tw, th, facecolor=RED, alpha=0.45,
                      edgecolor="black", linewidth=0.6)
        )  # fmt: skip
    for k in range(1, ntx):
        ax[1].axvline(k * tw - 0.5, color="white", linewidth=0.4)
    for k in range(1, nty):
        ax[1].axhline(k * th - 0.5, color="white", linewidth=0.4)
    ax[1].set_title(
        f"tile kernel: {th}x{tw} tiles, dirty ones computed\n"
        f"{dirty.sum()} of {dirty.size} tiles = {dirty.mean():.0%} of the map",
        fontsize=8,
    )
    ax[1].set_xticks([])
    ax[1].set_yticks([])
    rows = np.where(mask, 0.5, 0.0)
    ax[2].imshow(rows, cmap=ListedColormap([RED, GREY]), vmin=0, vmax=0.5, interpolation="nearest")
    ax[2].set_title(
        f"row kernel: each dirty pixel is one matrix row\n"
        f"{int((~mask).sum())} of {mask.size} pixels = {1 - mask.mean():.0%} of the map",
        fontsize=8,
    )
    ax[2].set_xticks([])
    ax[2].set_yticks([])
    fig.suptitle(
        "What a sparse kernel computes: ResNet-50 layer1_2/conv2 (3x3) on vtest frame 1",
        fontsize=10,
    )
    save(fig, "tiles")


# -- 5. refinement's per-pixel test -------------------------------------------------------


def _erode3(mask: np.ndarray) -> np.ndarray:
    """The AND-pool of a 3x3, stride 1, SAME convolution with zero motion."""
    p = np.pad(mask, 1, constant_values=True)
    h, w = mask.shape
    out = np.ones_like(mask)
    for dy in range(3):
        for dx in range(3):
            out &= p[dy : dy + h, dx : dx + w]
    return out


def fig_refine(delta: float = 0.05) -> None:
    """The change test at one convolution's input, on the frame after a refresh."""
    net = resnet()
    f = clip("vtest", 2)
    m = matching.match(jnp.asarray(f[0]), jnp.asarray(f[1]), block_size=10, psnr_threshold=20.0)
    conv = "ResNet50/layer2_1/conv2/conv"
    rec0 = net(f[0], np.zeros(SIZE, bool))
    rec1 = net(f[1], np.asarray(m.mask))
    out_key = net.find(rec1, conv, "conv_general_dilated")
    invar = str(net.eqn(out_key[0]).invars[0])
    in_key = next(k for k in rec1 if k[1] == invar)
    sig = net.sigs[in_key]
    (x0, _), (x1, r_in) = rec0[in_key], rec1[in_key]
    # On the frame after a refresh the reference is the refresh frame's input, and the
    # scale is measured on it (`dcjax.transforms.refine`).
    scale = float(refine.scale(jnp.asarray(x0), sig, "max_abs"))
    change = np.asarray(refine.change(jnp.asarray(x1), jnp.asarray(x0), sig, "max_abs"))
    small = change < delta * scale
    refined = r_in | small
    out_plain = rec1[out_key][1]
    assert np.array_equal(_erode3(r_in), out_plain)  # the 3x3 layer's own rule
    out_refined = _erode3(refined)

    fig, ax = plt.subplots(1, 5, figsize=(14, 3.4))
    show_mask(ax[0], r_in, f"input mask R_in (propagated)\n{r_in.mean():.0%} reusable")
    im = ax[1].imshow(change / scale, cmap="magma", vmin=0, vmax=4 * delta)
    ax[1].set_title(f"change / scale at the input\n(test: < delta = {delta})", fontsize=8)
    ax[1].set_xticks([])
    ax[1].set_yticks([])
    fig.colorbar(im, ax=ax[1], fraction=0.046)
    show_mask(ax[2], refined, f"R_in OR small change\n{refined.mean():.0%} reusable")
    show_mask(ax[3], out_plain, f"output mask, plain DeepCache\n{out_plain.mean():.0%} reusable")
    show_mask(ax[4], out_refined, f"output mask, refined\n{out_refined.mean():.0%} reusable")
    fig.suptitle(
        f"Refinement at the input of ResNet-50 {conv.split('/', 1)[1]} (3x3, {sig.size[0]}x"
        f"{sig.size[1]}), vtest frame 1 after a refresh",
        fontsize=10,
    )
    save(fig, "refine")


# -- 6. refresh and still frames over a stream --------------------------------------------


def fig_timeline(start: int = 40, count: int = 90) -> None:
    """Per frame of box: refreshed, skipped as still, or reused (PilotNet, default Config)."""
    name = "dave"
    shape = models.input_shape(name)
    module, variables = models.create(name)
    cached = deepcache.transform(
        module, variables, frame_shape=shape, preprocess=lambda f: models.preprocess(name, f)
    )
    frames = clip("box", count, size=shape[:2], start=start)
    _, _, infos = cached.run(jnp.asarray(frames))
    ratio = np.asarray(infos["flops_ratio"])
    refreshed = np.asarray(infos["refreshed"])
    skipped = np.asarray(infos["skipped"])
    reuse = np.asarray(infos["input_reuse"])
    t = np.arange(start, start + count)
    color = np.where(refreshed, RED, np.where(skipped, "#2b83ba", "#fdae61"))
    fig, ax = plt.subplots(figsize=(11, 3.2))
    ax.bar(t, np.where(skipped, 0.02, ratio), color=color, width=0.85)
    ax.plot(t, reuse, color="black", linewidth=1, label="input pixels reused (R0)")
    ax.set_ylim(0, 1.05)
    ax.set_xlim(t[0] - 1, t[-1] + 1)
    ax.set_xlabel("frame of box")
    ax.set_ylabel('info["flops_ratio"]')
    ax.legend(
        handles=[
            Patch(color=RED, label="refresh (every 10th frame): all recomputed"),
            Patch(color="#2b83ba", label="still frame: network skipped"),
            Patch(color="#fdae61", label="reuse: only what changed"),
            *ax.get_legend_handles_labels()[0],
        ],
        fontsize=7,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.2),
        ncol=4,
        frameon=False,
    )
    ax.set_title(
        "A stream through DeepCache's step: PilotNet (66x200), default Config", fontsize=10
    )
    save(fig, "timeline")


FIGURES = {
    "matcher": fig_matcher,
    "erosion": fig_erosion,
    "alignment": fig_alignment,
    "tiles": fig_tiles,
    "refine": fig_refine,
    "timeline": fig_timeline,
}


def main(argv: list[str]) -> int:
    names = argv or list(FIGURES)
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        print(f"unknown figure(s) {unknown}; choose from {list(FIGURES)}", file=sys.stderr)
        return 2
    for name in names:
        FIGURES[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
