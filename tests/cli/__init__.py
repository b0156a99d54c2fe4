"""Tests of the ``dcjax`` command (`dcjax.cli`)."""

#: A tiny run: PilotNet at a quarter of its width over three frames.
TINY = ["--model", "dave", "--width", "0.25", "--frames", "3", "--no-progress"]
