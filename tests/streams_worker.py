"""A process of the sharded and multi-process streams tests (tests/test_streams.py).

``python -m tests.streams_worker OUT [PROCESS_ID NUM_PROCESSES PORT]`` steps
`STREAMS` streams of the small ResNet-like model over real frames with the
streams split over a mesh of every device (`jax.devices()`), and saves this
process's part of the outputs and infos to ``OUT`` (an ``.npz``), with the
outputs of `Streams.run` in a single process. The device
count comes from ``XLA_FLAGS`` (``--xla_force_host_platform_device_count``),
set by the test before the process starts.
"""

from __future__ import annotations

import sys

import numpy as np

STREAMS, FRAMES, SIZE, OFFSET = 8, 5, 32, 4


def clip() -> np.ndarray:
    """(FRAMES, STREAMS, SIZE, SIZE, 3) uint8: the bundled vtest clip at
    different time offsets."""
    from dcjax.eval.harness import load_frames

    frames = load_frames("vtest", (SIZE, SIZE, 3), frames=FRAMES + OFFSET * (STREAMS - 1))
    return np.stack([frames[i * OFFSET : i * OFFSET + FRAMES] for i in range(STREAMS)], 1)


def cached_model():
    from dcjax import Config, transform
    from tests.transforms import small_models

    module, variables = small_models.create("resnet", SIZE)
    return transform(
        module, variables, frame_shape=(SIZE, SIZE, 3), config=Config(kernel="xla", refresh_every=3)
    )


def main(argv: list[str]) -> None:
    import jax

    path = argv[0]
    if len(argv) > 1:
        pid, count, port = (int(a) for a in argv[1:4])
        jax.distributed.initialize(
            coordinator_address=f"127.0.0.1:{port}", num_processes=count, process_id=pid
        )
    cached = cached_model()
    mesh = jax.make_mesh((len(jax.devices()),), ("streams",))
    streams = cached.streams(STREAMS, mesh=mesh)
    frames = clip()
    k = streams.local_count
    first = jax.process_index() * k
    mine = frames[:, first : first + k]
    states = streams.init()
    outs, refreshed = [], []
    for t in range(FRAMES):
        out, states, info = streams.step(states, mine[t])
        outs.append(streams.local(out))
        refreshed.append(streams.local(info["refreshed"]))
    # `run` in one process only (each compile of the step costs the suite time)
    run = None if len(argv) > 1 else streams.local(streams.run(mine)[0], axis=1)
    np.savez(
        path,
        outs=np.stack(outs),
        refreshed=np.stack(refreshed),
        run=np.zeros(0) if run is None else run,
        first=first,
        devices=len(jax.devices()),
        processes=jax.process_count(),
    )
    if len(argv) > 1:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
