"""`dcjax.Config`: each field validated by name; frozen and keyword-only."""

from __future__ import annotations

import pytest

from dcjax import deepcache


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"block_size": 0}, "block_size"),
        ({"refresh_every": 0}, "refresh_every"),
        ({"alignment": "nearest"}, "alignment"),
        ({"key": "last"}, "key"),
        ({"kernel": "cuda"}, "kernel"),
        ({"matcher": "sift"}, "matcher"),
        ({"min_match": 1.5}, "min_match"),
        ({"psnr_threshold": float("nan")}, "psnr_threshold"),
        ({"statistics": 1}, "statistics"),
        ({"max_pixel_change": 1.5}, "max_pixel_change"),
        ({"max_pixel_change": -0.01}, "max_pixel_change"),
        ({"max_pixel_change": True}, "max_pixel_change"),
        ({"pixel_change_size": 0}, "pixel_change_size"),
        ({"pixel_change_size": 2.0}, "pixel_change_size"),
        ({"pixel_change_size": True}, "pixel_change_size"),
        ({"pixel_change_size": 2}, "pixel_change_size"),  # without max_pixel_change
    ],
)
def test_config_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"Config.{field}"):
        deepcache.Config(**kwargs)


def test_config_is_frozen_and_keyword_only():
    cfg = deepcache.Config()
    with pytest.raises(AttributeError):
        cfg.block_size = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        deepcache.Config(10)  # type: ignore[misc]
