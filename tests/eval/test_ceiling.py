"""The reuse ceiling (`dcjax.eval.ceiling`): every reuse taken, measured as the harness does."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from dcjax import deepcache
from dcjax.config import Config, RefineConfig
from dcjax.eval import ceiling, harness


def test_sweep_lists_plain_deepcache_once_per_threshold():
    base = Config(block_size=8)
    configs = ceiling.sweep_configs([20, 30], [0, 0.05], ["auto", "all"], base=base)
    assert list(configs) == [
        "psnr=20", "psnr=20 delta=0.05 layers=auto", "psnr=20 delta=0.05 layers=all",
        "psnr=30", "psnr=30 delta=0.05 layers=auto", "psnr=30 delta=0.05 layers=all",
    ]  # fmt: skip
    assert configs["psnr=20"].refine is None and configs["psnr=30"].psnr_threshold == 30.0
    assert configs["psnr=30 delta=0.05 layers=all"].refine == RefineConfig(delta=0.05, layers="all")
    assert all(c.block_size == 8 for c in configs.values())  # the base's other settings kept


@pytest.fixture(scope="module")
def records(spec, clip):
    # "all": under "auto" none of the tiny model's layers is worth a test
    configs = ceiling.sweep_configs([20, float("inf")], [0, 0.2], ["all"])
    del configs["psnr=inf delta=0.2 layers=all"]
    return ceiling.reuse_ceiling(
        spec.module, spec.variables, clip, configs, preprocess=spec.preprocess, progress=False
    )


def test_never_reusing_is_the_model_itself(records, clip):
    never = records[2]
    assert never["label"] == "psnr=inf" and never["delta"] == 0.0 and never["layers"] is None
    assert never["ideal_speedup"] == 1.0 and never["input_reuse"] == 0.0
    assert never["refreshes"] == len(clip)  # nothing matched: every frame recomputed
    assert never["ideal_speedup_reuse"] is None
    assert never["top1_agreement"] == 1.0 and never["output_rel_mse"] < 1e-10


def test_every_reuse_is_taken_whatever_the_kernel_choice(records, spec, clip):
    """On CPU ``kernel="auto"`` computes the tiny model's layers in full (exact
    outputs, `test_harness`); the ceiling takes the reuse and pays its error."""
    plain, refined = records[0], records[1]
    assert plain["refreshes"] == 1 and plain["input_reuse"] > 0.5
    assert plain["ideal_speedup"] > 1.0
    auto = deepcache.transform(spec.module, spec.variables, frame_shape=clip.shape[1:])
    assert not any(auto.keeps_cache)  # the premise: "auto" reuses no layer here
    outs, _, _ = auto.run(jnp.asarray(clip), auto.init())
    ref = np.stack([np.asarray(spec.module.apply(spec.variables, f[None] / 255.0)) for f in clip])
    auto_err = float(np.mean((np.asarray(outs) - ref) ** 2) / np.var(ref))
    assert plain["output_rel_mse"] > 2 * auto_err  # the ceiling's layers reused their caches
    assert plain["ideal_speedup_reuse"] >= plain["ideal_speedup"]
    # refinement reuses at least what the matcher gives, here more
    assert refined["delta"] == 0.2 and refined["layers"] == "all"
    assert refined["ideal_speedup"] > plain["ideal_speedup"]


def test_numbers_match_the_harness_over_the_same_frames(records, spec, clip):
    """An independent path: the harness steps the method frame by frame and
    builds its record from the step infos and the no-cache step's outputs."""
    ev = harness.evaluate(spec, clip, ["deepcache:kernel=reference"], video_label="vtest",
                          progress=False)  # fmt: skip
    rec = ev.records[1]
    plain = records[0]
    assert plain["ideal_speedup"] == pytest.approx(rec["ideal_speedup"], rel=1e-5)
    assert plain["input_reuse"] == pytest.approx(
        float(np.mean(ev.infos[rec["variant"]]["input_reuse"])), rel=1e-6
    )
    assert plain["top1_agreement"] == rec["top1_agreement"]
    assert plain["top5_agreement"] == rec["top5_agreement"]
    assert plain["output_rel_mse"] == pytest.approx(rec["output_rel_mse"], rel=1e-3)


def test_best_is_the_fastest_setting_that_keeps_the_agreement():
    recs = [
        {"label": "a", "ideal_speedup": 1.5, "top1_agreement": 1.0},
        {"label": "b", "ideal_speedup": 3.0, "top1_agreement": 0.9},
        {"label": "c", "ideal_speedup": 2.0, "top1_agreement": 0.97},
        {"label": "d", "ideal_speedup": 9.0, "top1_agreement": None},
    ]
    assert ceiling.best(recs, 0.97)["label"] == "c"
    assert ceiling.best(recs, 0.9)["label"] == "b"
    assert ceiling.best(recs, 1.0)["label"] == "a"
    assert ceiling.best(recs[1:2], 0.97) is None


def test_a_plain_function_model_gives_the_modules_numbers(records, spec, clip):
    """``fn(variables, x)`` works as `deepcache.transform` takes it; the
    reference is the model's own output, with the same preprocessing."""

    def fn(variables, x):
        return spec.module.apply(variables, x)

    (rec,) = ceiling.reuse_ceiling(
        fn, spec.variables, clip, ceiling.sweep_configs([20], [0]), progress=False
    )
    plain = records[0]
    for key in ("ideal_speedup", "input_reuse", "top1_agreement", "output_rel_mse"):
        assert rec[key] == pytest.approx(plain[key], rel=1e-6), key
