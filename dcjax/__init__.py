"""dcjax: reuse CNN work across video frames (DeepCache for JAX).

What users call:

- `transform(model, variables, frame_shape=..., config=...)`: compile a Flax
  model or a function ``fn(variables, x)`` into a `CachedModel` whose jitted
  ``step(state, frame)`` recomputes only what changed since the last frame;
- `Config`, `RefineConfig`, `SemanticConfig`, `GuardConfig`: the settings
  (frozen, validated);
- `Match`: a known match (motion and reuse mask) to pass to ``step``;
- `CachedModel`, `CacheState`: the compiled model and its per-stream state;
- `Streams` (``cached.streams(n, mesh=...)``): many streams stepped together,
  pooled layer by layer, optionally split over devices and processes;
- `exit_point`: mark a semantic exit point in a plain JAX function;
- `adaptive` / `Adaptive`: several measured plans of one model, switched at
  run time by the stream's dirty fraction (`AdaptiveStreams`,
  ``adaptive.streams(n)``: many streams of them); `calibrate`: the dirty
  fractions a few frames show, per layer;
- `keep_freed_memory`, `run_on_calling_thread`: let the C library keep freed
  heap memory for the next frame, and run executables where it can keep it
  (`dcjax.allocator`; the ``dcjax`` command does both on start).

Subpackages: `dcjax.matching` (block matchers), `dcjax.transforms` (the jaxpr
passes), `dcjax.kernels` (masked sparse convolution), `dcjax.models` (Flax
model zoo), `dcjax.video` (video I/O and bundled clips), `dcjax.semantic` (SMTM
memory), `dcjax.eval` (the measuring harness and baselines), `dcjax.bench`
(benchmark programs). The contract is docs/design.md.
"""

__version__ = "0.1.0"

from dcjax.allocator import keep_freed_memory, run_on_calling_thread  # noqa: E402
from dcjax.config import Config, RefineConfig, SemanticConfig  # noqa: E402
from dcjax.deepcache import CachedModel, calibrate, transform  # noqa: E402
from dcjax.matching import Match  # noqa: E402
from dcjax.state import CacheState  # noqa: E402
from dcjax.streams import Streams  # noqa: E402
from dcjax.switching import Adaptive, AdaptiveStreams, adaptive  # noqa: E402
from dcjax.transforms.exits import exit_point  # noqa: E402
from dcjax.transforms.guard import GuardConfig  # noqa: E402

__all__ = [
    "Adaptive",
    "AdaptiveStreams",
    "CacheState",
    "CachedModel",
    "Config",
    "GuardConfig",
    "Match",
    "RefineConfig",
    "SemanticConfig",
    "Streams",
    "__version__",
    "adaptive",
    "calibrate",
    "exit_point",
    "keep_freed_memory",
    "run_on_calling_thread",
    "transform",
]
