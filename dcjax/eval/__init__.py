"""Evaluation: the method registry, the measuring harness, metrics, plots, reports.

- `dcjax.eval.registry`: ``METHODS``, ``register_method``, ``make_runner``,
  ``ModelSpec``, ``Runner``; the methods register themselves when their
  modules are imported, which this package does for all of them:
  `dcjax.eval.methods` (``nocache``, ``deepcache``),
  `dcjax.eval.refine_methods` (``deepcache+refine``, ``delta``),
  `dcjax.eval.semantic_methods` (``semantic``, ``deepcache+semantic``),
  `dcjax.eval.switching_method` (``adaptive``), and
  the baselines `dcjax.eval.deepmon`, `dcjax.eval.mil`, `dcjax.eval.frame`;
- `dcjax.eval.harness`: ``evaluate`` (interleaved per-frame timing of methods on
  the same frames), ``model_spec``, ``load_frames``;
- `dcjax.eval.interleaving`: the warm-up, the per-frame orders and the timed
  step of every interleaved measurement (the harness, ``dcjax bench streams``);
- `dcjax.eval.metrics`: the JSON record of one (model, video, method);
- `dcjax.eval.profile`: where a method's time goes, layer by layer
  (``dcjax profile``);
- `dcjax.eval.ceiling`: the ideal speedup of reuse settings against their
  fidelity, every reuse taken (``dcjax bench ceiling``);
- `dcjax.eval.plots` and `dcjax.eval.report`: matplotlib figures and the HTML
  report (imported on demand, they need matplotlib).

The paper's evaluation over models x videos x methods (``dcjax bench``) is
`dcjax.bench.evaluation`.
"""

# Every method module, imported once here so that each registers its methods;
# no module of this package imports this one.
from dcjax.eval import (
    deepmon,
    frame,
    harness,
    methods,
    metrics,
    mil,
    refine_methods,
    registry,
    semantic_methods,
    switching_method,
)
from dcjax.eval.harness import Evaluation, evaluate, load_frames
from dcjax.eval.metrics import check_record, make_record
from dcjax.eval.registry import METHODS, ModelSpec, Runner, register_method
from dcjax.eval.specs import model_spec

__all__ = [
    "METHODS",
    "Evaluation",
    "ModelSpec",
    "Runner",
    "check_record",
    "deepmon",
    "evaluate",
    "frame",
    "harness",
    "load_frames",
    "make_record",
    "methods",
    "metrics",
    "mil",
    "model_spec",
    "refine_methods",
    "register_method",
    "registry",
    "semantic_methods",
    "switching_method",
]
