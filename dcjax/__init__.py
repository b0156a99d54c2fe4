"""dcjax: reuse CNN work across video frames (DeepCache for JAX).

Public API:

- `dcjax.deepcache`: ``transform``, ``Config``, ``RefineConfig``,
  ``SemanticConfig``, ``Match``, ``CachedModel``, ``CacheState``.
- `dcjax.exit_point`: mark a semantic exit point in a plain JAX function.
- Subpackages: `dcjax.matching` (block matchers), `dcjax.kernels` (masked
  sparse convolution), `dcjax.models` (Flax model zoo), `dcjax.video` (video
  I/O and bundled clips), `dcjax.semantic` (SMTM memory), `dcjax.eval`
  (benchmark harness and baselines).
"""

__version__ = "0.1.0"

from dcjax.transforms.exits import exit_point  # noqa: E402  (semantic exit marks)

__all__ = ["__version__", "exit_point"]
