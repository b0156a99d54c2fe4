"""The ``dcjax`` command (also ``python -m dcjax``).

Subcommands:

- ``dcjax demo``: the pretrained EfficientNet-Lite0 over the bundled
  fixed-camera clip, without and with DeepCache; prints a short table and
  writes ``dcjax-demo/report.html`` (plots, a strip of frames with the reuse
  mask drawn over them) and ``dcjax-demo/metrics.json``.
- ``dcjax run VIDEO --model NAME [--pretrained] [--method deepcache]
  [--frames N] [--json out.json] [--out annotated.mp4]``: one model and one
  method (against ``nocache``) on any video FFmpeg reads. ``--model`` is a
  zoo model or a bundled real ONNX model (``centerface``,
  `dcjax.models.onnx_zoo`); with a detector, the records carry box F1
  against the uncached model and ``--anonymize --out blurred.mp4`` writes
  the video with the faces found blurred.
- ``dcjax profile VIDEO --model NAME [--methods ...]``: where each method's
  time goes, layer by layer.
- ``dcjax bench [--models M ...] [--videos PATH ...] [--methods ...]
  [--frames N] [--json out.json] [--report out.html]``: DeepCache's
  evaluation (Section 7): every model x video x method, optional sweeps.
- ``dcjax bench PROGRAM ...``: a benchmark program of `dcjax.bench`
  (``kernels``, ``matvec``, ``matchers``, ``zoo``, ``semantic``,
  ``ceiling``), with options of its own.
- ``dcjax models``: the zoo with input shapes, parameters and FLOPs.

``demo``, ``run``, ``bench`` and ``profile`` resize the frames to the model's
published input unless ``--size HxW`` builds the model for frames of that
size (decoded at it) or ``--native`` for each video's own size (not resized);
every zoo model takes any size that leaves each layer a pixel
(`dcjax.eval.specs.input_size_error`), and the records say the
``frame_shape`` they ran at.

A bad argument is reported on one line, naming the argument, with exit
status 2 (``dcjax: error: argument --frames: ...``), before any model loads:
videos included (a file FFmpeg cannot read, or with fewer frames from
``--start`` on than the command needs), and where the results go (a directory
given for a file, an ``--out`` name FFmpeg cannot encode H.264 into; missing
parent directories are created). A video whose stream breaks part way runs on
the frames decoded before the break, with a warning on stderr that says where
it stopped. Ctrl-C ends a command with one line and exit status 130; ``bench``
writes each record to its JSON as it comes, says how many are there, and with
``--report`` writes their report (marked as interrupted) before it exits.

Compiled programs are kept between runs in JAX's persistent compilation cache
(`compilation_cache_dir`): a cached step takes far longer to compile than the
plain model, and a second run with the same model, method and shapes loads
it instead (see docs/performance-notes.md, "The command keeps compiled steps
between runs").

Modules: `dcjax.cli.app` (the parser and `main`), `dcjax.cli.subcommands`
(``demo``, ``run``, ``profile``, ``models``), `dcjax.cli.evaluation`
(``bench``); the argument checks they share with the benchmark programs are
`dcjax.bench.arguments`.
"""

from dcjax.cli.app import (
    COMPILATION_CACHE_MAX_BYTES,
    build_parser,
    compilation_cache_dir,
    main,
)

__all__ = ["COMPILATION_CACHE_MAX_BYTES", "build_parser", "compilation_cache_dir", "main"]
