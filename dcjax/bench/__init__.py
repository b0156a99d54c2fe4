"""Benchmark programs: ``dcjax bench PROGRAM ...``."""
