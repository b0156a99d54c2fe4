"""The `Match` pytree every matcher returns and `deepcache.transform` consumes.

Contract (DESIGN.md, "The contract" 1): `motion = (dy, dx)` is the global motion
in input pixels and `mask[y, x]` means `cur[y, x] ~ prev[y + dy, x + dx]`. The
remaining fields are diagnostics a matcher may leave as ``None`` (an injected
match carries only `motion` and `mask`).
"""

from __future__ import annotations

import dataclasses

import jax


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class Match:
    """Result of matching the current frame against the previous one.

    Attributes:
        motion: int32 ``(2,)``, the global motion ``(dy, dx)``:
            ``cur[y, x] ~ prev[y + dy, x + dx]``.
        mask: bool ``(H, W)``, input pixels whose content can be reused.
        block_vectors: int32 ``(nby, nbx, 2)``, per-block best motion vector.
        block_psnr: float32 ``(nby, nbx)``, per-block PSNR at the global motion.
        match_ratio: float32 scalar, fraction of blocks matched at the global
            motion.
    """

    motion: jax.Array
    mask: jax.Array
    block_vectors: jax.Array | None = None
    block_psnr: jax.Array | None = None
    match_ratio: jax.Array | None = None
