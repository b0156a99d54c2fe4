"""SMTM early exits inside the cached step (used by `dcjax.deepcache`).

`SemanticExits` is built by `deepcache.transform` when ``Config.semantic`` is
set. Per frame it:

1. picks the fast memory from the frequency and time-stamp tables (Eqs. 5, 6);
2. evaluates the model segment by segment (`dcjax.transforms.exits`); after
   exit point ``l`` it pools the marked feature map over space (the semantic
   vector), compares it with the fast memory's centres (Eq. 1), accumulates SA
   (Eq. 3) and computes AC (Eq. 4); the rest of the network is the false
   branch of ``lax.cond(AC > tau, ...)``;
3. on an exit returns the stored mean output of the matched class; otherwise
   the model's own output, whose top-1 is the frame's class;
4. updates the tables, the predicted class's centres at the exit points it
   reached (Eq. 7) and, after a full inference, its mean output;
5. guards the exits (`dcjax.semantic.guard`): at most
   ``SemanticConfig.max_exits`` in a row, then a full inference that checks
   the last exit's class; a stream whose checks disagree too often, or whose
   calibration failed its held-back check (`dcjax.semantic.check`), runs
   without exits.

The class of a frame is the arg-max over the last axis of the model's first
output (averaged over any other axes): the memory has one slot per output unit.

Calibration differs from the paper: SMTM initialises the centres on a labelled
training set; none ships here, so `SemanticExits.calibrate` runs the full model
over calibration images, labels each with the model's own top-1 and averages
the semantic vectors (and outputs) per class. The counts ``m`` of Eq. 7 start
at the number of calibration images of each class, and the calibration
frequencies break ties when the fast memory is filled (the frequency table
itself starts at zero, as in the paper).

DeepCache: the layers a frame runs reuse their caches as usual; the layers an
exit skips keep their old caches, flagged invalid (`CacheState.layer_valid`),
so the next frame recomputes them in full.

Batches of streams: under `jax.vmap` the conditionals become selects and every
branch is computed (correct, no saving). With ``SemanticConfig(batch_axis=
name)`` and ``jax.vmap(..., axis_name=name)`` the batch exits at an exit point
only when all its streams pass the test (a ``psum`` makes the predicate
unbatched), so the skipped layers are really skipped.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from dcjax.config import SemanticConfig
from dcjax.kernels import dense_conv_eqn
from dcjax.semantic import guard as guard_lib
from dcjax.semantic import memory as mem
from dcjax.semantic.check import CalibrationCheck, check_held_back
from dcjax.transforms import exits
from dcjax.transforms.interpreter import Env, Policy, run_eqns
from dcjax.transforms.motion import FrameContext
from dcjax.transforms.records import Analysis

__all__ = ["SemanticExits"]


class _ExitPolicy(Policy):
    """The step's policy as the exits need it: each layer's result is
    ``(cache, reuse fraction, ran)``; without reuse (``dense``) ``(reuse
    fraction, ran)``, the caches being the old ones. No epilogue is fused."""

    def __init__(self, inner: Policy, dense: bool) -> None:
        self._inner, self._dense = inner, dense

    def reuse(self, layer, eqn, invals, mask, epilogue):
        if self._dense:  # no cache to read or write: the fastest dense convolution
            return dense_conv_eqn(eqn, invals), (jnp.float32(0.0), jnp.bool_(True))
        out, result = self._inner.reuse(layer, eqn, invals, mask, None)
        fraction = jnp.mean(result.mask, dtype=jnp.float32)
        return out, (result.cache, fraction, jnp.bool_(True))

    def dense(self, index, eqn, invals):
        return self._inner.dense(index, eqn, invals)


class SemanticExits:
    """The exit points of one traced model and the SMTM policy over them.

    Args:
        config: the semantic configuration.
        analysis: the analysed traced model (with its exit marks).
    """

    def __init__(self, config: SemanticConfig, analysis: Analysis) -> None:
        self.config = config
        self.analysis = analysis
        self.plan = exits.plan(analysis, config.exit_points)
        self._vector_axes: list[tuple[int, ...]] = []
        dims = []
        for var, sig in zip(self.plan.variables, self.plan.signatures, strict=True):
            shape = tuple(var.aval.shape)
            axes = tuple(sig.axes) if sig is not None else ()
            self._vector_axes.append(axes)
            dims.append(int(np.prod([d for i, d in enumerate(shape) if i not in axes])))
        self.dims = tuple(dims)
        outvars = analysis.jaxpr.jaxpr.outvars
        self.out_avals = [v.aval for v in outvars]
        first = self.out_avals[0]
        if first.ndim == 0 or first.shape[-1] < 2:
            raise ValueError(
                "dcjax: semantic exits need a classifier: the model's first output must end "
                f"with an axis of at least 2 classes, got shape {tuple(first.shape)}"
            )
        self.num_classes = int(first.shape[-1])
        self.memory = mem.empty_state(
            self.num_classes,
            self.dims,
            tuple(tuple(a.shape) for a in self.out_avals),
            tau=config.tau,
        )
        self._calibrate_jit = jax.jit(jax.vmap(self._full, in_axes=(None, 0)))
        #: without reuse (``dense``) the step keeps no layer caches
        self.dense = False
        #: the last calibration's held-back check (None before one)
        self.check: CalibrationCheck | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """The exit points, in order."""
        return self.plan.names

    # -- pieces --------------------------------------------------------------

    def vector(self, e: int, value: jax.Array) -> jax.Array:
        """The semantic vector at exit point ``e``: GAP over the spatial axes."""
        axes = self._vector_axes[e]
        v = jnp.mean(value.astype(jnp.float32), axis=axes) if axes else value
        return v.reshape(-1).astype(jnp.float32)

    def classify(self, outputs: Sequence[jax.Array]) -> jax.Array:
        """The frame's class: arg-max over the last axis of the first output."""
        out = jnp.asarray(outputs[0], jnp.float32).reshape(-1, self.num_classes)
        return jnp.argmax(out.mean(axis=0)).astype(jnp.int32)

    # -- the step ------------------------------------------------------------

    def step(
        self,
        memory: mem.SemanticState,
        args: Sequence[Any],
        masks: Sequence[Any],
        ctx: FrameContext,
        policy: Policy,
        old_caches: Sequence[jax.Array],
        update: jax.Array,
    ) -> tuple[list, list, list, jax.Array, mem.SemanticState, dict]:
        """One frame with early exits.

        Args:
            memory: the stream's semantic memory.
            args, masks: the traced model's inputs and their reuse masks.
            ctx: the frame's motion.
            policy: the step's interpreter `Policy`; its reuse results have
                the layer's output ``mask`` and its new ``cache``.
            old_caches: the caches of the previous frame (kept by skipped layers).
            update: whether to update the memory with this frame (false for a
                non-finite frame).

        Returns:
            ``(outputs, caches, fractions, ran, memory, info)``.
        """
        cfg, plan = self.config, self.plan
        classes, active, k = mem.fast_memory(
            memory.frequency,
            memory.since_seen,
            memory.prior,
            window=cfg.window,
            confidence=cfg.confidence,
            max_fast=cfg.max_fast,
        )
        n_exits = plan.num_exits
        allowed = guard_lib.allows(memory.guard, cfg.max_exits)
        carry = {
            "sa": jnp.zeros(classes.shape, jnp.float32),
            "ac": jnp.full((n_exits,), jnp.nan, jnp.float32),
            "slot": jnp.int32(0),
            "vectors": tuple(jnp.zeros((d,), jnp.float32) for d in self.dims),
        }

        def test(e, value, c):
            sv = self.vector(e, value)
            s = mem.cosine_similarity(sv, memory.centres[e][classes])
            valid = active & (memory.counts[e, classes] > 0)
            sa = jnp.where(valid, mem.cumulative_similarity(c["sa"], s, e + 1), -jnp.inf)
            ac, slot = mem.accumulated_confidence(sa)
            take = (ac > memory.tau) & allowed
            if cfg.batch_axis is not None:
                passed = lax.psum(take.astype(jnp.int32), cfg.batch_axis)
                take = passed == lax.psum(1, cfg.batch_axis)
            vectors = tuple(sv if i == e else v for i, v in enumerate(c["vectors"]))
            c = {"sa": sa, "ac": c["ac"].at[e].set(ac), "slot": slot.astype(jnp.int32),
                 "vectors": vectors}  # fmt: skip
            return take, c

        def exit_outputs(e, c):
            cls = classes[c["slot"]]
            return [m[cls] for m in memory.out_means]

        def skipped(index):
            if self.dense:
                return jnp.float32(0.0), jnp.bool_(False)
            return old_caches[index], jnp.float32(0.0), jnp.bool_(False)

        outs, results, exit_index, carry = exits.evaluate_with_exits(
            plan,
            self.analysis,
            args,
            masks,
            ctx,
            _ExitPolicy(policy, self.dense),
            skipped,
            test,
            exit_outputs,
            carry,
        )
        n_layers = len(old_caches)
        if self.dense:
            results = {i: (old_caches[i], *r) for i, r in results.items()}
        caches = [results[i][0] for i in range(n_layers)]
        fractions = [results[i][1] for i in range(n_layers)]
        ran = (
            jnp.stack([results[i][2] for i in range(n_layers)])
            if n_layers
            else (jnp.zeros((0,), bool))
        )

        exited = exit_index >= 0
        exit_class = classes[carry["slot"]]
        predicted = jnp.where(exited, exit_class, self.classify(outs)).astype(jnp.int32)
        reached = jnp.where(exited, jnp.arange(n_exits) <= exit_index, True)
        new = self._update(memory, carry["vectors"], outs, predicted, reached, exited, exit_class)
        checked = update & (new.guard.checks > memory.guard.checks)
        agreed = checked & (new.guard.mismatches == memory.guard.mismatches)
        memory = jax.tree_util.tree_map(lambda a, b: jnp.where(update, a, b), new, memory)
        info = {
            "exit": exit_index,
            "exit_class": jnp.where(exited, exit_class, -1).astype(jnp.int32),
            "ac": carry["ac"],
            "fast_size": k,
            "predicted_class": predicted,
            # 1: a check agreed with the last exit, -1: it did not, 0: no check
            "exit_check": jnp.where(agreed, 1, jnp.where(checked, -1, 0)).astype(jnp.int32),
            "exits_enabled": memory.guard.enabled,
        }
        return outs, caches, fractions, ran, memory, info

    def _update(self, memory, vectors, outs, predicted, reached, exited, exit_class):
        frequency, since_seen = mem.update_tables(memory.frequency, memory.since_seen, predicted)
        centres, counts = memory.centres, memory.counts
        if self.config.adapt_centres:
            centres, counts = mem.update_centres(centres, counts, vectors, predicted, reached)
        out_means, out_counts = mem.update_outputs(
            memory.out_means, memory.out_counts, outs, predicted, ~exited
        )
        return mem.SemanticState(
            centres=centres,
            counts=counts,
            frequency=frequency,
            since_seen=since_seen,
            prior=memory.prior,
            out_means=out_means,
            out_counts=out_counts,
            tau=memory.tau,
            guard=guard_lib.after_frame(
                memory.guard,
                exited=exited,
                exit_class=exit_class,
                predicted=predicted,
                max_exits=self.config.max_exits,
                min_agreement=self.config.min_agreement,
            ),
        )

    # -- calibration ---------------------------------------------------------

    def _full(self, leaves, x):
        """The full model on one input: its outputs and the semantic vectors."""
        n = len(leaves)
        analysis = self.analysis
        h, w = x.shape[1:3]
        env = Env.of(analysis, [*leaves, x], [True] * n + [jnp.zeros((h, w), bool)])
        ctx = FrameContext(jnp.zeros((2,), jnp.int32), "exact")
        run_eqns(env, 0, len(analysis.eqns), ctx, Policy())
        outs, _ = env.outputs()
        vectors = tuple(self.vector(e, env.read(v)[0]) for e, v in enumerate(self.plan.variables))
        return list(outs), vectors

    def features(
        self, leaves: Sequence[Any], inputs: jax.Array, batch_size: int = 16
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The full model's outputs and semantic vectors on preprocessed ``inputs``.

        Args:
            leaves: the model's variable leaves.
            inputs: ``(N, 1, H, W, C)`` model inputs.
            batch_size: inputs evaluated per compiled call.

        Returns:
            ``(outputs, vectors)``: per model output ``(N, *shape)``, per exit
            point ``(N, D_e)``, as numpy arrays.
        """
        outs_all: list[list[np.ndarray]] = []
        vecs_all: list[list[np.ndarray]] = []
        for start in range(0, inputs.shape[0], batch_size):
            chunk = inputs[start : start + batch_size]
            pad = batch_size - chunk.shape[0]
            if pad:  # one compiled shape for every chunk
                chunk = jnp.concatenate([chunk, jnp.repeat(chunk[-1:], pad, axis=0)])
            outs, vecs = self._calibrate_jit(list(leaves), chunk)
            keep = batch_size - pad
            outs_all.append([np.asarray(o)[:keep] for o in outs])
            vecs_all.append([np.asarray(v)[:keep] for v in vecs])
        outs = [np.concatenate([c[i] for c in outs_all]) for i in range(len(outs_all[0]))]
        vecs = [np.concatenate([c[i] for c in vecs_all]) for i in range(len(vecs_all[0]))]
        return outs, vecs

    def labels(self, outputs: Sequence[np.ndarray]) -> np.ndarray:
        """Each input's class from `features`' outputs (as `classify` does)."""
        out = np.asarray(outputs[0], np.float64)
        return np.argmax(out.reshape(out.shape[0], -1, self.num_classes).mean(axis=1), axis=-1)

    def calibrate(
        self,
        leaves: Sequence[Any],
        inputs: jax.Array,
        batch_size: int = 16,
    ) -> mem.SemanticState:
        """Initialise the memory from the full model on preprocessed ``inputs``.

        Checks the exits on the ``SemanticConfig.holdout`` share of the inputs
        first (`dcjax.semantic.check`, kept as `check`): where they agree with
        the full model less than ``min_agreement``, the memory is switched off
        (a warning says so) and the stream runs without exits. The centres are
        then the means over every input.

        Args:
            leaves: the model's variable leaves.
            inputs: ``(N, 1, H, W, C)`` model inputs.
            batch_size: inputs evaluated per compiled call.

        Returns:
            The calibrated memory (also kept as `memory`, the initial memory
            of new states).
        """
        outs, vecs = self.features(leaves, inputs, batch_size)
        n, k = outs[0].shape[0], self.num_classes
        labels = self.labels(outs)
        cfg = self.config
        self.check = check_held_back(
            vecs, labels, tau=cfg.tau, share=cfg.holdout, min_agreement=cfg.min_agreement
        )
        if not self.check.passed:
            warnings.warn(f"dcjax: semantic exits switched off: {self.check.describe()}",
                          stacklevel=3)  # fmt: skip
        count = np.bincount(labels, minlength=k).astype(np.float32)
        safe = np.maximum(count, 1.0)

        def per_class(x: np.ndarray) -> np.ndarray:
            sums = np.zeros((k, *x.shape[1:]), np.float64)
            np.add.at(sums, labels, x.astype(np.float64))
            return (sums / safe.reshape((k,) + (1,) * (x.ndim - 1))).astype(np.float32)

        self.memory = mem.SemanticState(
            centres=tuple(jnp.asarray(per_class(v)) for v in vecs),
            counts=jnp.asarray(np.broadcast_to(count, (len(vecs), k)).copy()),
            frequency=jnp.zeros((k,), jnp.float32),
            since_seen=jnp.zeros((k,), jnp.int32),
            prior=jnp.asarray(count / max(n, 1)),
            out_means=tuple(jnp.asarray(per_class(o)) for o in outs),
            out_counts=jnp.asarray(count),
            tau=jnp.float32(self.config.tau),
            guard=guard_lib.fresh(enabled=self.check.passed),
        )
        return self.memory
