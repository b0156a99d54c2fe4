"""Evaluation: the method registry, the measuring harness, metrics, plots, reports.

- `dcjax.eval.methods`: ``METHODS`` and ``register_method`` (``nocache``,
  ``deepcache``, and the baselines ``deepmon``, ``mil``, ``frame``);
- `dcjax.eval.harness`: ``evaluate`` (interleaved per-frame timing of methods on
  the same frames), ``model_spec``, ``load_frames``;
- `dcjax.eval.metrics`: the JSON record of one (model, video, method);
- `dcjax.eval.bench`: the paper's evaluation (``dcjax bench``);
- `dcjax.eval.profile`: where a method's time goes, layer by layer
  (``dcjax profile``);
- `dcjax.eval.ceiling`: the ideal speedup of reuse settings against their
  fidelity, every reuse taken (``python -m dcjax.eval.ceiling``);
- `dcjax.eval.plots` and `dcjax.eval.report`: matplotlib figures and the HTML
  report (imported on demand, they need matplotlib).
"""

from dcjax.eval import harness, methods, metrics
from dcjax.eval.harness import Evaluation, evaluate, load_frames, model_spec
from dcjax.eval.methods import METHODS, ModelSpec, Runner, register_method
from dcjax.eval.metrics import check_record, make_record

__all__ = [
    "METHODS",
    "Evaluation",
    "ModelSpec",
    "Runner",
    "check_record",
    "evaluate",
    "harness",
    "load_frames",
    "make_record",
    "methods",
    "metrics",
    "model_spec",
    "register_method",
]
