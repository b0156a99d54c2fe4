"""Fixtures of the bench tests: those of the eval tests (a tiny CNN, short real frames)."""

from tests.eval.conftest import clip, spec  # noqa: F401
