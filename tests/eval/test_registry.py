"""The method registry: registering, parsing and checking method specs, option rules."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dcjax.eval import registry
from dcjax.eval.registry import make_runner, parse_method, register_method


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


def test_registry_has_the_methods():
    assert {"nocache", "deepcache", "deepmon", "mil", "frame"} <= set(registry.METHODS)
    assert all(info.description for info in registry.METHODS.values())


def test_register_method_rejects_duplicates_and_bad_names():
    with pytest.raises(ValueError, match="already registered"):
        register_method("deepcache")(lambda spec, options: None)
    with pytest.raises(ValueError, match="must be non-empty"):
        register_method("a:b")


def test_register_method_adds_a_usable_method(spec, clip):
    name = "test_only_nocache_alias"

    @register_method(name, "nocache under another name")
    def _alias(s, options):
        return make_runner(s, "nocache", options)

    try:
        outs, _, _ = _steps(make_runner(spec, name), clip[:2])
        np.testing.assert_allclose(outs, _reference(spec, clip[:2]), rtol=1e-5, atol=1e-5)
    finally:
        del registry.METHODS[name]


def test_parse_method():
    assert parse_method("deepcache") == ("deepcache", {})
    assert parse_method("deepcache:psnr_threshold=25,matcher=diamond,refresh_every=None") == (
        "deepcache",
        {"psnr_threshold": 25, "matcher": "diamond", "refresh_every": None},
    )
    assert parse_method("deepcache:psnr_threshold=inf") == (
        "deepcache",
        {"psnr_threshold": float("inf")},
    )
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        parse_method("nope")
    with pytest.raises(ValueError, match="key=value"):
        parse_method("deepcache:oops")


def test_parse_method_keeps_commas_inside_brackets_and_quotes():
    assert parse_method("deepmon:grid=(4,4),bins=8") == ("deepmon", {"grid": (4, 4), "bins": 8})
    assert parse_method("deepcache+refine:layers=['a/conv','b,c'],delta=0.1") == (
        "deepcache+refine",
        {"layers": ["a/conv", "b,c"], "delta": 0.1},
    )
    for spec in ("deepmon:grid=(4,4", "deepcache+refine:layers=['a]"):
        with pytest.raises(ValueError, match="unbalanced"):
            parse_method(spec)


# (spec, what the error must name): every registered method refuses bad values
# of its options before a model is loaded
_BAD_SPECS = [
    ("nocache:impl=fastest", "impl='fastest'"),
    ("plain:form=fast", "form='fast'"),
    ("deepcache:block_size=-3", "block_size"),
    ("deepcache:bogus=1", "'bogus'"),
    ("deepcache+refine:delta=-1", "delta"),
    ("delta:metric='l7'", "metric"),
    ("deepmon:grid=3", "grid=3"),
    ("deepmon:grid=(4,0)", "grid=(4, 0)"),
    ("deepmon:first_convs=-1", "first_convs=-1"),
    ("deepmon:bins=True", "bins=True"),
    ("deepmon:expiry_s=0", "expiry_s=0"),
    ("deepmon:kernel=fastest", "kernel='fastest'"),
    ("mil:block_size=0", "block_size=0"),
    ("mil:fraction=2", "fraction=2"),
    ("mil:psnr_threshold=nan", "psnr_threshold"),
    ("mil:refresh_every=0", "refresh_every=0"),
    ("frame:min_match=x", "min_match='x'"),
    ("frame:block_size=2.5", "block_size=2.5"),
    ("semantic:tau=abc", "tau"),
    ("semantic:calib_frames=0", "calib_frames"),
    ("semantic:calibration=nowhere.mp4", "nowhere.mp4"),
    ("deepcache+semantic:window=0", "window"),
    ("semantic:max_exits=0", "max_exits"),
    ("deepcache+semantic:min_agreement=2", "min_agreement"),
    ("semantic:holdout=0.9", "holdout"),
    ("adaptive:patience=0", "patience=0"),
    ("adaptive:levels=0.5|0.2", "levels"),
    ("adaptive:smoothing=2", "smoothing=2"),
]


def test_every_method_checks_its_options():
    assert {spec.partition(":")[0] for spec, _ in _BAD_SPECS} == set(registry.METHODS)


@pytest.mark.parametrize("spec,named", _BAD_SPECS)
def test_check_method_refuses_bad_values_naming_them(spec, named):
    name = spec.partition(":")[0]
    with pytest.raises(registry.MethodOptionError) as exc:
        registry.check_method(spec)
    assert named in str(exc.value) and repr(name) in str(exc.value)


@pytest.mark.parametrize(
    "spec",
    [
        "nocache:impl=const",
        "plain:form=args",
        "deepcache:psnr_threshold=25,block_size=20",
        "deepcache+refine:delta=0.1,layers=('a','b')",
        "delta:delta=0",
        "deepmon:grid=(4,4),bins=8,first_convs=None,expiry_s=0.5",
        "deepmon:expiry_s=inf",
        "mil:fraction=0.5,refresh_every=None,psnr_threshold=inf",
        "frame:min_match=0.9",
        "semantic:calibration=none,tau=1",
        "deepcache+semantic:calibration=vtest,calib_frames=4",
    ],
)
def test_check_method_accepts_good_values(spec):
    name, options = registry.check_method(spec)
    assert name == spec.partition(":")[0] and options


def test_option_rules():
    assert registry.positive_int(3) == 3
    assert registry.optional_positive_int(None) is None
    for bad in (0, -1, True, 2.0, "3"):
        with pytest.raises(ValueError, match="positive int"):
            registry.positive_int(bad)
    unit = registry.number(0.0, 1.0)
    assert unit(1) == 1.0 and isinstance(unit(1), float)
    for bad in (1.5, -0.1, float("nan"), "0.5", False):
        with pytest.raises(ValueError, match=r"in \[0, 1\]"):
            unit(bad)
    assert registry.number()(float("inf")) == float("inf")
    with pytest.raises(ValueError, match=">= 0"):
        registry.number(lo=0.0)(-1)
    with pytest.raises(ValueError, match="one of a, b"):
        registry.one_of(("a", "b"))("c")


def test_make_runner_reports_what_the_model_refuses(spec):
    # a layer the model does not have: only the factory, with the model, can tell
    with pytest.raises(registry.MethodOptionError, match="nope"):
        make_runner(spec, "deepcache+refine", {"layers": ("nope",)})


def test_unknown_option_is_named(spec):
    with pytest.raises(ValueError, match="'bogus'"):
        make_runner(spec, "deepcache", {"bogus": 1})
    with pytest.raises(ValueError, match="'bogus'"):
        make_runner(spec, "frame", {"bogus": 1})
