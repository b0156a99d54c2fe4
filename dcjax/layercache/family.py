"""A family of networks that share layers through transfer learning, to measure
the layer cache on: the pretrained EfficientNet-Lite0 fine-tuned with optax on
five small tasks made from the bundled clips.

Contract: `TASKS` names the tasks (two classes each; their accuracy is not the
point, the weights they leave are). `fine_tune(task, frozen=...)` returns the
Flax variables of EfficientNet-Lite0 with a two-class head trained on ``task``:

- ``frozen="all"``: only the head is trained (the paper's transfer-learning
  setting: networks that share every layer but the last);
- ``frozen=k`` (an int): for ``k >= 1`` the stem and the first ``k`` of the 16
  blocks keep the pretrained weights, the rest and the head are trained; with
  ``k=0`` every layer changes. Networks fine-tuned with the same ``k`` share a
  prefix of ``k`` blocks.

`build(root, ...)` saves, for every task, the head-only variant (``head-TASK``;
with ``frozen=k``, the variant sharing ``k`` blocks, ``frozenK-TASK``) and the
fully fine-tuned one (``full-TASK``) into a layer store
(`dcjax.layercache.save`), once; `networks(similar)` lists the five networks
of a run in which ``similar`` of them share layers.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dcjax.layercache.store import Manifest, save

__all__ = ["TASKS", "build", "fine_tune", "networks", "task_frames"]

#: Task name -> what the two classes are.
TASKS: dict[str, str] = {
    "clip": "which bundled clip a frame is from: vtest (fixed camera) or box (handheld)",
    "half": "box: a frame from the first or the second half of the clip",
    "mirror": "vtest: a frame as filmed or mirrored left to right",
    "flip": "vtest: a frame upright or upside down",
    "rows": "vtest768: a 224x224 crop from the top or the bottom half of the frame",
}
MODEL = "efficientnet_lite0"


@functools.cache
def _clip(name: str, size: tuple[int, int] | None, frames: int) -> np.ndarray:
    from dcjax import video

    return np.stack(list(video.read(video.clip_path(name), size=size, max_frames=frames)))


def task_frames(task: str, n: int = 32, size: tuple[int, int] = (224, 224)):
    """``(frames, labels)``: ``n`` uint8 frames of ``size`` for ``task``, half of
    each class, and their labels (0 or 1)."""
    if task not in TASKS:
        raise ValueError(f"dcjax: unknown task {task!r}; choose one of {', '.join(TASKS)}")
    half = n // 2
    if task == "clip":
        a, b = _clip("vtest", size, 300)[::9][:half], _clip("box", size, 300)[::9][:half]
    elif task == "half":
        box = _clip("box", size, 300)
        a, b = box[:150][:: max(1, 150 // half)][:half], box[150:][:: max(1, 150 // half)][:half]
    elif task in ("mirror", "flip"):
        v = _clip("vtest", size, 300)[:: max(1, 300 // n)][:n]
        a = v[:half]
        b = v[half : 2 * half][:, :, ::-1] if task == "mirror" else v[half : 2 * half][:, ::-1]
    else:
        big = _clip("vtest768", None, 100)[:: max(1, 100 // half)][:half]
        h, w = size
        top = big[:, :h, (big.shape[2] - w) // 2 : (big.shape[2] + w) // 2]
        bottom = big[:, -h:, (big.shape[2] - w) // 2 : (big.shape[2] + w) // 2]
        if top.shape[1:3] != tuple(size):
            raise ValueError(f"dcjax: task rows needs a size of at most 576x768, got {size}")
        a, b = top, bottom
    frames = np.concatenate([a, b])
    labels = np.array([0] * len(a) + [1] * len(b), np.int32)
    return frames, labels


def _trainable(frozen: int | str) -> Any:
    def keep(path: Sequence[Any]) -> bool:  # True: the pretrained value stays
        top = str(getattr(path[0], "key", path[0]))
        if top == "fc":
            return False
        if frozen == "all":
            return True
        if top == "stem":  # frozen with the first block
            return int(frozen) > 0
        if top.startswith("block"):
            return int(top[len("block") :]) < int(frozen)
        return False  # the head conv

    return keep


def fine_tune(task: str, *, frozen: int | str = "all", steps: int = 30, seed: int = 0,
              size: tuple[int, int] = (96, 96), lr: float = 1e-3) -> dict[str, Any]:  # fmt: skip
    """EfficientNet-Lite0's variables with a two-class head trained on ``task``
    (module docstring): ``steps`` of Adam on batches of 8 frames of ``size``
    (small, to keep it cheap on a CPU; the network takes any size). BatchNorm
    statistics keep their pretrained values."""
    import optax

    from dcjax import models

    if frozen != "all" and not (isinstance(frozen, int) and 0 <= frozen <= 16):
        raise ValueError(f"dcjax: frozen must be 'all' or 0..16 blocks, got {frozen!r}")
    module, pretrained = models.create(MODEL, pretrained=True)
    rng = np.random.default_rng(seed)
    head = {"kernel": jnp.asarray(rng.normal(0, 0.01, (1280, 2)), jnp.float32),
            "bias": jnp.zeros((2,), jnp.float32)}  # fmt: skip
    params = {**pretrained["params"], "fc": head}
    stats = pretrained["batch_stats"]
    two = type(module)(num_classes=2)
    keep = _trainable(frozen)
    mask = jax.tree_util.tree_map_with_path(lambda p, _: not keep(p), params)
    opt = optax.masked(optax.adam(lr), mask)
    state = opt.init(params)
    frames, labels = task_frames(task, n=32, size=size)
    x_all = models.preprocess(MODEL, frames)

    @jax.jit
    def step(params, state, x, y):
        def loss(p):
            logits = two.apply({"params": p, "batch_stats": stats}, x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        grads = jax.grad(loss)(params)
        grads = jax.tree_util.tree_map(lambda g, m: g if m else jnp.zeros_like(g), grads, mask)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    for _ in range(steps):
        idx = rng.choice(len(frames), 8, replace=False)
        params, state = step(params, state, x_all[idx], labels[idx])
    return {"params": params, "batch_stats": stats}


def _kind(frozen: int | str) -> str:
    return "head" if frozen == "all" else f"frozen{int(frozen)}"


def build(root: str | Path, *, steps: int = 30, frozen: int | str = "all",
          progress: bool = True) -> dict[str, Manifest]:  # fmt: skip
    """Saves, for every task, the variant fine-tuned with ``frozen`` (the
    head-only one by default, named ``head-TASK``; ``frozen=k`` gives
    ``frozenK-TASK``) and the fully fine-tuned one (``full-TASK``) under
    ``root``, skipping those already saved, and returns their manifests."""
    from tqdm.auto import tqdm

    root = Path(root)
    out = {}
    todo = [(kind, task) for task in TASKS for kind in (_kind(frozen), "full")]
    for kind, task in tqdm(todo, desc="dcjax: fine-tuning", unit="network", disable=not progress):
        name = f"{kind}-{task}"
        if (root / "models" / f"{name}.json").exists():
            out[name] = Manifest.read(root, name)
            continue
        variables = fine_tune(task, frozen=frozen if kind != "full" else 0, steps=steps)
        out[name] = save(variables, root, name)
    return out


def networks(similar: int, frozen: int | str = "all") -> list[str]:
    """The five networks of a run in which ``similar`` share layers: variants of
    the first ``similar`` tasks fine-tuned with ``frozen`` (head-only: they share
    all but their last layer; ``frozen=k``: a prefix of ``k`` blocks), fully
    fine-tuned variants of the others (which share nothing)."""
    if not 0 <= similar <= len(TASKS):
        raise ValueError(f"dcjax: similar must be 0..{len(TASKS)}, got {similar}")
    kind = _kind(frozen)
    return [f"{kind if i < similar else 'full'}-{t}" for i, t in enumerate(TASKS)]
