"""SMTM semantic memory: early exits where a stream's recent classes are recognised.

Li et al., "Boosting Mobile CNN Inference through Semantic Memory" (MM '21).
Enable it with ``deepcache.Config(semantic=deepcache.SemanticConfig(...))``;
`dcjax.semantic.memory` holds the fixed-shape tables and Equations 1 to 7,
`dcjax.semantic.smtm` the policy inside the cached step,
`dcjax.semantic.guard` the bound on consecutive exits and their checks,
`dcjax.semantic.check` the calibration's held-back check,
`dcjax.semantic.ceiling` the most any exit threshold could exit at a given
agreement, and
``dcjax bench semantic`` the benchmark.
"""

from dcjax.config import SemanticConfig
from dcjax.semantic.ceiling import exit_ceiling
from dcjax.semantic.check import CalibrationCheck, check_held_back
from dcjax.semantic.guard import ExitGuard
from dcjax.semantic.memory import (
    SemanticState,
    accumulated_confidence,
    cosine_similarity,
    cumulative_similarity,
    fast_memory,
    memory_bytes,
    replacement_scores,
    update_centres,
    update_tables,
)
from dcjax.semantic.smtm import SemanticExits

__all__ = [
    "CalibrationCheck",
    "ExitGuard",
    "SemanticConfig",
    "SemanticExits",
    "SemanticState",
    "accumulated_confidence",
    "check_held_back",
    "cosine_similarity",
    "cumulative_similarity",
    "exit_ceiling",
    "fast_memory",
    "memory_bytes",
    "replacement_scores",
    "update_centres",
    "update_tables",
]
