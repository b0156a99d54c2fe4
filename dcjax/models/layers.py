"""Building blocks shared by the dcjax model zoo.

Contract: every block is NHWC and inference-only (BatchNorm uses running averages,
there is no dropout), and is written with the primitives whose reuse-mask rules
`dcjax.deepcache.transform` knows: ``conv_general_dilated``, ``reduce_window_max`` /
``reduce_window_sum`` (pooling, and the channel-window sum of LRN), elementwise
arithmetic (``max``, ``min``, ``mul``, ``add``, ``rsqrt``, ``pow`` ...), ``concatenate``
along channels, ``reshape``/``broadcast_in_dim``, reductions over H and W (global
pooling) and ``dot_general`` for dense heads. Activations are spelled as plain
``max``/``min`` so that no ``custom_jvp_call`` wrapper appears in the jaxpr.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import flax.linen as nn
import jax.numpy as jnp
from jax import lax

__all__ = [
    "Activation",
    "ConvBN",
    "LocalResponseNorm",
    "avg_pool",
    "global_avg_pool",
    "leaky_relu",
    "make_divisible",
    "max_pool",
    "relu",
    "relu6",
    "scale_channels",
]

Activation = Callable[[jnp.ndarray], jnp.ndarray]


def relu(x: jnp.ndarray) -> jnp.ndarray:
    """ReLU as a single ``max`` primitive."""
    return jnp.maximum(x, 0.0)


def relu6(x: jnp.ndarray) -> jnp.ndarray:
    """ReLU6 as ``max`` then ``min``."""
    return jnp.minimum(jnp.maximum(x, 0.0), 6.0)


def leaky_relu(x: jnp.ndarray, slope: float = 0.1) -> jnp.ndarray:
    """Leaky ReLU (Darknet's slope 0.1) as ``mul`` then ``max``."""
    return jnp.maximum(x, slope * x)


def make_divisible(value: float, divisor: int = 8, min_value: int | None = None) -> int:
    """Rounds a channel count to a multiple of ``divisor`` (MobileNet convention).

    The result is never below ``min_value`` (default ``divisor``) and never more than
    10% below ``value``.
    """
    min_value = divisor if min_value is None else min_value
    new = max(min_value, int(value + divisor / 2) // divisor * divisor)
    if new < 0.9 * value:
        new += divisor
    return new


def scale_channels(channels: int, width: float, divisor: int = 8) -> int:
    """Channel count of a layer under a width multiplier.

    ``width == 1`` returns ``channels`` unchanged (the published architecture);
    otherwise the scaled count is rounded to a multiple of ``divisor`` (so grouped
    convolutions stay valid) and is at least ``divisor``.
    """
    if width == 1.0:
        return channels
    return max(divisor, int(round(channels * width / divisor)) * divisor)


def _pool_padding(
    size: int, window: int, stride: int, pad: int, ceil_mode: bool
) -> tuple[int, int]:
    """Low/high padding of one spatial axis, adding Caffe's ceil-mode extra cells."""
    if not ceil_mode:
        return pad, pad
    span = size + 2 * pad - window
    out = -(-span // stride) + 1
    # Caffe/PyTorch: the last window must start inside the (left-padded) input.
    if (out - 1) * stride >= size + pad:
        out -= 1
    extra = max(0, (out - 1) * stride + window - (size + 2 * pad))
    return pad, pad + extra


def max_pool(
    x: jnp.ndarray,
    window: int,
    stride: int,
    padding: int = 0,
    *,
    ceil_mode: bool = False,
) -> jnp.ndarray:
    """Square max pooling over H and W (``reduce_window_max``), padding with -inf.

    Args:
        x: (N, H, W, C) input.
        window: side of the pooling window.
        stride: stride along H and W.
        padding: symmetric padding along H and W.
        ceil_mode: round the output size up, as Caffe (and PyTorch's ``ceil_mode``)
            do, by padding the high side with -inf.

    Returns:
        The pooled (N, H', W', C) array.
    """
    pads = [_pool_padding(x.shape[axis], window, stride, padding, ceil_mode) for axis in (1, 2)]
    return lax.reduce_window(
        x,
        -jnp.inf,
        lax.max,
        (1, window, window, 1),
        (1, stride, stride, 1),
        ((0, 0), pads[0], pads[1], (0, 0)),
    )


def avg_pool(x: jnp.ndarray, window: int, stride: int, padding: int = 0) -> jnp.ndarray:
    """Square average pooling (``reduce_window_sum`` then a constant divide).

    Padded cells count in the divisor (``count_include_pad``), so the op is a
    windowed sum followed by an elementwise scale.
    """
    pad = (padding, padding)
    summed = lax.reduce_window(
        x, 0.0, lax.add, (1, window, window, 1), (1, stride, stride, 1), ((0, 0), pad, pad, (0, 0))
    )
    return summed / float(window * window)


def global_avg_pool(x: jnp.ndarray) -> jnp.ndarray:
    """Mean over H and W: (N, H, W, C) -> (N, C). Mixes all spatial positions."""
    return jnp.mean(x, axis=(1, 2))


class LocalResponseNorm(nn.Module):
    """Caffe's cross-channel local response normalisation (``ACROSS_CHANNELS``).

    ``y = x / (k + alpha / n * sum_{c' in window(c)} x[c']**2) ** beta`` with a window
    of ``n`` channels centred on ``c`` (zero-padded at the ends). The window sum is a
    ``reduce_window_sum`` whose window is 1 along N, H and W, so spatial positions
    are never mixed: the reuse mask passes through unchanged.

    Attributes:
        size: channels in the window (``local_size``), odd.
        alpha: scale (Caffe divides it by ``size``).
        beta: exponent.
        k: additive constant.
    """

    size: int = 5
    alpha: float = 1e-4
    beta: float = 0.75
    k: float = 1.0

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        if self.size % 2 != 1:
            raise ValueError(f"dcjax: LocalResponseNorm.size must be odd, got {self.size}")
        half = self.size // 2
        window = (1,) * (x.ndim - 1) + (self.size,)
        pads = ((0, 0),) * (x.ndim - 1) + ((half, half),)
        sq_sum = lax.reduce_window(x * x, 0.0, lax.add, window, (1,) * x.ndim, pads)
        scale = self.k + (self.alpha / self.size) * sq_sum
        return x * scale ** (-self.beta)


class ConvBN(nn.Module):
    """Convolution, optional inference BatchNorm, optional activation.

    Attributes:
        features: output channels.
        kernel: kernel side (square).
        stride: stride along H and W.
        padding: symmetric padding along H and W; ``None`` means ``kernel // 2``.
        groups: ``feature_group_count`` (``groups == in_channels`` is depthwise).
        use_bias: add a bias (default: only when there is no BatchNorm).
        bn: follow the convolution with BatchNorm (running averages).
        bn_eps: BatchNorm epsilon.
        act: activation applied last, or ``None``.
    """

    features: int
    kernel: int = 3
    stride: int = 1
    padding: int | Sequence[tuple[int, int]] | None = None
    groups: int = 1
    use_bias: bool | None = None
    bn: bool = True
    bn_eps: float = 1e-5
    act: Activation | None = relu

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        pad = self.kernel // 2 if self.padding is None else self.padding
        if isinstance(pad, int):
            pad = ((pad, pad), (pad, pad))
        use_bias = (not self.bn) if self.use_bias is None else self.use_bias
        x = nn.Conv(
            self.features,
            (self.kernel, self.kernel),
            strides=(self.stride, self.stride),
            padding=tuple(tuple(p) for p in pad),
            feature_group_count=self.groups,
            use_bias=use_bias,
            name="conv",
        )(x)
        if self.bn:
            x = nn.BatchNorm(use_running_average=True, epsilon=self.bn_eps, name="bn")(x)
        if self.act is not None:
            x = self.act(x)
        return x
