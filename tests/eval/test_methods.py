"""Each method's behaviour on constructed frame sequences."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dcjax.eval import deepmon, methods, mil, registry
from dcjax.eval.registry import make_runner


def _steps(runner, frames):
    state = runner.init()
    outs, infos = [], []
    for f in frames:
        out, state, info = runner.step(state, jnp.asarray(f))
        outs.append(np.asarray(out))
        infos.append(jax.tree_util.tree_map(np.asarray, info))
    return np.stack(outs), infos, state


def _reference(spec, frames):
    return np.stack([np.asarray(spec.apply(jnp.asarray(f))) for f in frames])


def test_nocache_is_the_model(spec, clip):
    outs, infos, _ = _steps(make_runner(spec, "nocache"), clip[:3])
    np.testing.assert_allclose(outs, _reference(spec, clip[:3]), rtol=1e-5, atol=1e-5)
    assert all(float(i["flops_ratio"]) == 1.0 for i in infos)


@pytest.mark.parametrize("method", ["deepcache", "deepmon", "mil", "frame"])
def test_identical_frames_give_the_uncached_output_with_reuse(spec, clip, method):
    frames = np.stack([clip[0]] * 4)
    runner = make_runner(spec, method)
    outs, infos, _ = _steps(runner, frames)
    ref = _reference(spec, frames)
    np.testing.assert_allclose(outs, ref, rtol=1e-4, atol=1e-4)
    assert bool(infos[0]["refreshed"])
    # Every later frame reuses something (and frame/deepcache reuse everything).
    assert all(float(i["flops_ratio"]) < 1.0 for i in infos[1:])
    if method in ("frame", "deepcache", "mil"):
        # every convolution reused; the dense head (16 -> 10) still runs, but for `frame`
        # and `deepcache`, which skip the network on a still frame (`skip_unchanged`)
        head = 0 if method in ("frame", "deepcache") else 2 * 16 * 10
        expected = head / runner.total_flops
        assert all(float(i["flops_ratio"]) == pytest.approx(expected, abs=1e-6) for i in infos[1:])


def test_frame_reuses_exactly_when_the_frame_matches(spec, clip):
    changed = clip[0].copy()
    changed[:10, :10] = 255 - changed[:10, :10]  # one block changed a lot
    frames = np.stack([clip[0], clip[0], changed, changed])
    runner = make_runner(spec, "frame")
    outs, infos, _ = _steps(runner, frames)
    assert [bool(i["refreshed"]) for i in infos] == [True, False, True, False]
    assert [float(i["flops_ratio"]) for i in infos] == [1.0, 0.0, 1.0, 0.0]
    np.testing.assert_allclose(outs, _reference(spec, frames), rtol=1e-5, atol=1e-5)


def test_frame_key_is_the_last_full_run(spec, clip):
    """A slow drift is caught: the key does not follow the frames that hit."""
    base = clip[0].astype(np.int16)
    frames = np.stack([np.clip(base + 12 * k, 0, 255).astype(np.uint8) for k in range(6)])
    _, infos, _ = _steps(make_runner(spec, "frame", {"psnr_threshold": 25.0}), frames)
    hits = [not bool(i["refreshed"]) for i in infos]
    assert hits[1] and not all(hits[1:])


def test_deepmon_reuses_only_the_first_convs(spec, clip):
    frames = np.stack([clip[0]] * 3)
    runner = make_runner(spec, "deepmon", {"first_convs": 1})
    _, infos, _ = _steps(runner, frames)
    for info in infos[1:]:
        rf = info["reuse_fraction"]
        assert rf[0] == pytest.approx(1.0)
        assert np.all(rf[1:] == 0.0)
        assert not bool(info["skipped"])  # DeepMon runs its later layers on still frames too
    assert runner.config["skip_unchanged"] is False
    assert runner.config["matcher"] == "histogram"
    assert runner.config["cached_layers"] == [runner.layers[0].name]
    # only that layer is reported as computed sparsely, though every layer keeps a
    # cache under the tile kernel
    tiles = make_runner(spec, "deepmon", {"first_convs": 1, "kernel": "xla"})
    assert all(tiles.cached.keeps_cache)
    assert [lay.sparse for lay in tiles.layers] == [True] + [False] * (len(tiles.layers) - 1)


def test_deepmon_default_policy(spec):
    runner = make_runner(spec, "deepmon")
    # TinyCNN: conv1 at stride 1, conv2 at stride 2, conv3 at stride 4: all <= 4.
    assert runner.config["first_convs"] == 3
    assert make_runner(spec, "deepmon", {"max_stride": 2}).config["first_convs"] == 2
    # Expiry 1 s at the spec's 10 fps: a full recompute every 10 frames.
    assert runner.config["refresh_every"] == 10
    assert make_runner(spec, "deepmon", {"expiry_s": 0.65}).config["refresh_every"] == 6


def test_deepmon_expiry_refreshes(spec, clip):
    frames = np.stack([clip[0]] * 7)
    _, infos, _ = _steps(make_runner(spec, "deepmon", {"expiry_s": 0.3}), frames)
    assert [bool(i["refreshed"]) for i in infos] == [True, False, False, True, False, False, True]
    runner = make_runner(spec, "deepmon", {"expiry_s": float("inf")})  # never expires
    _, infos, _ = _steps(runner, frames)
    assert [bool(i["refreshed"]) for i in infos] == [True] + [False] * 6
    assert runner.config["refresh_every"] is None and runner.config["expiry_s"] == "inf"


def test_block_match_map_marks_exactly_the_changed_block():
    rng = np.random.default_rng(0)
    prev = jnp.asarray(rng.normal(size=(1, 12, 10, 4)), jnp.float32)
    cur = prev.at[0, 4:8, 5:10].add(3.0)
    hit = np.asarray(mil.block_match_map(cur, prev, (1, 2), 4, 20.0))
    want = np.ones((12, 10), bool)
    want[4:8, 4:10] = False  # blocks are 4 wide: columns 4..7 and 8..9 hold changes
    np.testing.assert_array_equal(hit, want)
    assert np.asarray(mil.block_match_map(prev, prev, (1, 2), 3, 200.0)).all()


def test_mil_exact_threshold_is_exact_and_reuses(spec, clip):
    """Only identical blocks match: the output is the full recompute's, with reuse taken."""
    changed = clip[0].copy()
    changed[:8, :8] = 0
    frames = np.stack([clip[0], changed, changed])
    runner = make_runner(spec, "mil", {"psnr_threshold": 400.0})
    outs, infos, _ = _steps(runner, frames)
    np.testing.assert_allclose(outs, _reference(spec, frames), rtol=1e-5, atol=1e-5)
    rf = infos[1]["reuse_fraction"]
    assert 0.3 < rf[0] < 1.0  # conv1 recomputes around the changed corner only
    assert np.all(infos[2]["reuse_fraction"] == 1.0)


def test_mil_fraction_limits_the_matched_layers(spec, clip):
    """MIL-50%: only the first half of the convolutions are matched; the rest recompute."""
    runner = make_runner(spec, "mil", {"psnr_threshold": 400.0, "fraction": 0.5})
    assert runner.config["matched_layers"] == 2
    frames = np.stack([clip[0], clip[0]])
    _, infos, _ = _steps(runner, frames)
    assert infos[1]["reuse_fraction"][2] == 0.0  # beyond MIL-50%: recomputed
    assert infos[1]["reuse_fraction"][0] == 1.0


def test_default_first_convs_counts_leading_high_resolution_layers(spec):
    layers = spec.analysis.layers
    assert deepmon.default_first_convs(layers, 1) == 1
    assert deepmon.default_first_convs(layers, 2) == 2
    assert deepmon.default_first_convs((), 4) == 0


class _Grouped(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.Conv(8, (3, 3), padding="SAME")(x)
        x = nn.Conv(8, (3, 3), strides=(2, 2), padding="SAME", feature_group_count=8)(
            x
        )  # depthwise
        x = nn.Conv(8, (3, 3), padding=((1, 1), (0, 2)), feature_group_count=2)(x)  # grouped
        return x.mean((1, 2))


def test_nocache_and_plain_agree_on_grouped_convolutions(clip):
    module = _Grouped()
    size = clip.shape[1]
    variables = module.init(jax.random.PRNGKey(1), jnp.zeros((1, size, size, 3)))
    spec = registry.ModelSpec(
        name="grouped", module=module, variables=variables, frame_shape=(size, size, 3)
    )
    fast = make_runner(spec, "nocache")
    plain = make_runner(spec, "plain")
    closed = make_runner(spec, "plain", {"form": "const"})
    const = make_runner(spec, "nocache", {"impl": "const"})
    assert fast.config == {"impl": "fast"} and plain.config == {"form": "args"}
    assert const.config == {"impl": "const"} and closed.config == {"form": "const"}
    a, _, _ = _steps(fast, clip[:2])
    b, _, _ = _steps(plain, clip[:2])
    c, _, _ = _steps(const, clip[:2])
    d, _, _ = _steps(closed, clip[:2])
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(c, a, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(d, b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(b, _reference(spec, clip[:2]), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="impl"):
        make_runner(spec, "nocache", {"impl": "plain"})  # the plain model is its own method
    with pytest.raises(ValueError, match="form"):
        make_runner(spec, "plain", {"form": "fast"})


def test_config_dict_is_json_serialisable():
    import dataclasses
    import json

    from dcjax.config import Config

    cfg = Config(matcher="histogram", matcher_options={"grid": (4, 4)}, psnr_threshold=float("inf"))
    d = methods.config_dict(cfg)
    assert json.loads(json.dumps(d)) == d
    assert d["matcher_options"] == {"grid": [4, 4], "bins": 16, "distance_threshold": 0.005}
    assert d["psnr_threshold"] == "inf"
    assert set(d) == {f.name for f in dataclasses.fields(Config)}
    from dcjax.config import RefineConfig

    d = methods.config_dict(Config(refine=RefineConfig()))  # nested configs become dicts
    assert isinstance(d["refine"], dict) and json.loads(json.dumps(d)) == d


@pytest.mark.parametrize("method", ["deepcache+refine", "delta"])
def test_refinement_methods_reuse_identical_frames_exactly(spec, clip, method):
    # kernel="auto" runs these tiny layers dense on CPU: nothing to refine there
    runner = make_runner(spec, method, {"delta": 0.1, "layers": "all", "kernel": "xla"})
    frames = [clip[0], clip[0], clip[0]]
    outs, infos, state = _steps(runner, frames)
    np.testing.assert_allclose(outs, _reference(spec, frames), rtol=1e-5, atol=1e-5)
    assert runner.config["refine"]["delta"] == 0.1
    assert float(np.mean(infos[-1]["reuse_fraction"])) == 1.0
    if method == "delta":
        assert runner.config["matcher"] == "none"
        assert float(infos[-1]["input_reuse"]) == 0.0  # reuse came from the change test alone


def test_runners_say_which_layers_they_compute_sparsely(spec):
    n_conv = len(spec.analysis.layers)
    tiles = make_runner(spec, "deepcache", {"kernel": "xla"})
    assert [lay.sparse for lay in tiles.layers] == [True] * n_conv + [False] * (
        len(tiles.layers) - n_conv
    )  # the fully connected head is computed in full without refinement
    refined = make_runner(spec, "deepcache+refine", {"kernel": "xla", "layers": "all"})
    assert all(lay.sparse for lay in refined.layers)  # refinement updates the head by rows
    dense = make_runner(spec, "deepcache", {"kernel": "dense"})
    assert not any(lay.sparse for lay in dense.layers)
    never = make_runner(spec, "deepcache", {"kernel": "xla", "psnr_threshold": float("inf")})
    assert all(never.cached.keeps_cache) and not any(lay.sparse for lay in never.layers)
    assert all(lay.sparse is None for lay in make_runner(spec, "nocache").layers)


def test_the_timed_twin_runs_the_plan_the_reporting_runner_raced_to(
    spec, clip, monkeypatch, tmp_path
):
    """The timed twin is the reporting runner's model without statistics
    (`CachedModel.with_statistics`), not a second transform: a second race on
    the calibration frames may pick another plan, and the record would mix one
    plan's times and outputs with another's statistics."""
    import dataclasses

    from dcjax.eval.registry import make_runner
    from tests.tuning_fakes import fake_measurements, race_samples_of

    costs = {"dense": lambda f: 1e-3, "xla": lambda f: 1e-4 + 5e-4 * f, "rows": lambda f: 2e-3}
    fake_measurements(monkeypatch, tmp_path / "tuning.json", costs)
    # cached wins, then nocache would (the fixed rules' plan and the cuts race
    # after the others where they differ)
    verdicts = iter([(1.0, 2.0, 3.0), (3.0, 2.0, 1.0)])
    monkeypatch.setattr(
        "dcjax.race.race_samples",
        lambda models, frames, *a, **k: race_samples_of(next(verdicts), models, rest=4.0),
    )  # fmt: skip
    calibrated = dataclasses.replace(spec, calibration=np.asarray(clip))
    runner = make_runner(calibrated, "deepcache", {"tuning": "measure"})
    timed = runner.timed()  # no race: a second one would have chosen nocache
    assert runner.config["plan"] == timed.config["plan"] == "cached"
    assert timed.cached.tuning is runner.cached.tuning
    assert timed.cached.keeps_cache == runner.cached.keeps_cache and any(timed.cached.keeps_cache)
    assert [lp.kernel for lp in timed.cached.plan.layers] == [
        lp.kernel for lp in runner.cached.plan.layers
    ]
    assert timed.config["statistics"] is False and runner.config["statistics"] is True
    a, b = runner.init(), timed.init()
    for f in clip:  # one plan: the same outputs; statistics from the reporting runner only
        out_a, a, info_a = runner.step(a, jnp.asarray(f))
        out_b, b, info_b = timed.step(b, jnp.asarray(f))
        np.testing.assert_allclose(np.asarray(out_a), np.asarray(out_b), rtol=1e-5, atol=1e-6)
        assert np.isfinite(float(info_a["flops_ratio"]))
    assert np.isnan(float(info_b["flops_ratio"])) or bool(info_b["skipped"])
