"""dcjax: reuse CNN work across video frames (DeepCache for JAX)."""

__version__ = "0.1.0"
