"""Synthetic camera motion over real photos, with ground truth, for tests.

:func:`camera_motion` films a photo from :mod:`skimage.data` with a virtual
camera that pans, shakes (jitter) and zooms, pastes objects that move on their
own, lets the brightness drift and adds sensor noise. It returns the frames
with the ground truth a block matcher should recover.

Ground-truth convention (the one of ``dcjax.matching``): for frame ``t >= 1``
with global motion ``motion[t] = (dy, dx)``::

    frames[t][y, x] ~ frames[t - 1][y + dy, x + dx]

on every pixel where ``reusable[t]`` is true. ``dy > 0`` means the camera moved
down (content moves up on screen). ``motion[0] = (0, 0)``.

- ``in_view[t, y, x]``: ``(y + dy, x + dx)`` lies inside frame ``t - 1``
  (pixels outside it show content the camera just uncovered).
- ``moved[t, y, x]``: the pixel moved differently from the global motion:
  it shows a pasted object in frame ``t``, or its source ``(y + dy, x + dx)``
  showed one in frame ``t - 1`` (background an object uncovered), or, with
  zoom, its true displacement differs from ``(dy, dx)`` by half a pixel or
  more. It may include object pixels that happen to match.
- ``reusable = in_view & ~moved``; all false for frame 0.

With ``zoom=0``, ``brightness=0`` and ``noise=0`` the relation is exact:
``frames[t][y, x] == frames[t - 1][y + dy, x + dx]`` on reusable pixels (each
frame is an integer crop of one canvas). Zoom resamples (bilinear), drift and
noise perturb, so then it holds approximately. The output is deterministic
given ``seed``; camera path, objects and noise draw from independent streams,
so turning noise on does not change the motion.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

import numpy as np

__all__ = ["SyntheticVideo", "camera_motion"]


@dataclass(frozen=True)
class SyntheticVideo:
    """Frames of a synthetic clip and their ground truth.

    Attributes:
        frames: ``(T, H, W, 3)`` ``uint8`` frames.
        motion: ``(T, 2)`` ``int64`` global motion ``(dy, dx)`` of each frame
            relative to the previous one (``(0, 0)`` for frame 0).
        moved: ``(T, H, W)`` bool, pixels that moved differently from the
            global motion (pasted objects, what they uncovered, zoom).
        in_view: ``(T, H, W)`` bool, pixels whose source ``(y + dy, x + dx)``
            lies inside the previous frame (false for frame 0).
        gain: ``(T,)`` brightness gain applied to each frame.
        scale: ``(T,)`` zoom factor of each frame relative to frame 0.
    """

    frames: np.ndarray
    motion: np.ndarray
    moved: np.ndarray
    in_view: np.ndarray
    gain: np.ndarray
    scale: np.ndarray

    @property
    def reusable(self) -> np.ndarray:
        """``(T, H, W)`` bool: ``in_view & ~moved``, the ideal pixel reuse mask."""
        return self.in_view & ~self.moved

    def __len__(self) -> int:
        return int(self.frames.shape[0])


def camera_motion(
    num_frames: int = 16,
    size: tuple[int, int] = (224, 224),
    *,
    image: str | np.ndarray = "astronaut",
    pan: tuple[int, int] = (0, 2),
    jitter: int = 0,
    zoom: float = 0.0,
    objects: int = 0,
    object_size: tuple[int, int] | None = None,
    object_speed: int = 3,
    object_image: str | np.ndarray = "coffee",
    brightness: float = 0.0,
    noise: float = 0.0,
    seed: int = 0,
) -> SyntheticVideo:
    """Films a photo with a moving virtual camera.

    Args:
        num_frames: Number of frames ``T``.
        size: Frame size ``(H, W)``.
        image: The scene: the name of a colour or grey photo in
            :mod:`skimage.data` (``"astronaut"``, ``"coffee"``, ``"chelsea"``,
            ``"rocket"``, ``"hubble_deep_field"``, ...) or an ``(h, w, 3)`` /
            ``(h, w)`` ``uint8`` array. Upscaled (bilinear) when the camera
            path needs more room than it has.
        pan: Camera velocity ``(vy, vx)`` in whole pixels per frame.
        jitter: Handheld shake: each frame's camera position is offset by a
            uniform random integer in ``[-jitter, jitter]`` per axis, so the
            motion is ``pan`` plus the difference of two offsets.
        zoom: Relative change of scale per frame (``0.01``: 1% zoom-in each
            frame, negative zooms out), about the frame centre.
        objects: Number of pasted objects (elliptic patches of
            ``object_image``) moving in screen coordinates with random integer
            velocities up to ``object_speed`` per axis, bouncing off the edges.
        object_size: Object size ``(h, w)``; default a quarter of the frame.
        object_speed: Largest object speed per axis, pixels per frame (>= 1).
        object_image: Where the objects' texture comes from (as ``image``).
        brightness: Brightness drift: frame ``t`` is multiplied by
            ``1 + brightness * t``.
        noise: Standard deviation of Gaussian sensor noise, in 8-bit levels.
        seed: Seed of every random choice.

    Returns:
        The frames and their ground truth (see the module docstring).

    Raises:
        ValueError: an argument is out of range or ``image`` is unknown.
    """
    height, width = _check_args(num_frames, size, pan, jitter, zoom, objects, object_speed, noise)
    if object_size is None:
        object_size = (max(2, height // 4), max(2, width // 4))
    obj_h, obj_w = (int(v) for v in object_size)
    if objects and not (0 < obj_h < height and 0 < obj_w < width):
        raise ValueError(
            f"dcjax: object_size must fit strictly inside the frame {size}, got {object_size}"
        )
    motion_seq, object_seq, noise_seq = np.random.SeedSequence(seed).spawn(3)
    rng_motion = np.random.default_rng(motion_seq)
    rng_objects = np.random.default_rng(object_seq)
    rng_noise = np.random.default_rng(noise_seq)

    # Camera: integer screen-space motion d_t; centre c_t moves by d_t / s_{t-1}.
    steps = num_frames
    shake = rng_motion.integers(-jitter, jitter + 1, size=(steps, 2)) if jitter else None
    motion = np.zeros((steps, 2), np.int64)
    for t in range(1, steps):
        motion[t] = pan
        if shake is not None:
            motion[t] += shake[t] - shake[t - 1]
    scale = (1.0 + zoom) ** np.arange(steps, dtype=np.float64)
    centre = np.zeros((steps, 2), np.float64)
    for t in range(1, steps):
        centre[t] = centre[t - 1] + motion[t] / scale[t - 1]
    if shake is not None:
        centre += shake[0]  # frame 0 shaken too; motion only sees differences
    half = np.array([(height - 1) / 2.0, (width - 1) / 2.0])

    # Canvas: the photo, upscaled if the path does not fit, path centred in it.
    photo = _load_photo(image, "image")
    lo = (centre - half[None] / scale[:, None]).min(axis=0) - 2.0
    hi = (centre + half[None] / scale[:, None]).max(axis=0) + 2.0
    need = hi - lo + 1.0
    factor = max(1.0, float(np.max(need / np.array(photo.shape[:2]))))
    if factor > 1.0:
        photo = _upscale(photo, factor)
    offset = np.floor((np.array(photo.shape[:2]) - need) / 2.0) - lo
    centre = centre + offset

    canvas = photo.astype(np.float32)
    background = np.empty((steps, height, width, 3), np.float32)
    for t in range(steps):
        if zoom == 0.0:
            top, left = (int(round(v)) for v in centre[t] - half)
            background[t] = canvas[top : top + height, left : left + width]
        else:
            background[t] = _sample(canvas, centre[t], half, scale[t], height, width)

    object_masks = _paste_objects(
        background, objects, (obj_h, obj_w), object_speed, object_image, rng_objects
    )

    # Photometric changes.
    gain = 1.0 + brightness * np.arange(steps, dtype=np.float64)
    frames = background * gain[:, None, None, None].astype(np.float32)
    if noise > 0:
        frames = frames + rng_noise.normal(0.0, noise, size=frames.shape).astype(np.float32)
    frames = np.clip(np.rint(frames), 0, 255).astype(np.uint8)

    moved, in_view = _ground_truth(motion, object_masks, scale, half)
    return SyntheticVideo(
        frames=frames,
        motion=motion,
        moved=moved,
        in_view=in_view,
        gain=gain,
        scale=scale,
    )


def _paste_objects(
    background: np.ndarray,
    objects: int,
    size: tuple[int, int],
    speed: int,
    image: str | np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """Pastes textured ellipses moving in screen space into ``background`` (in place).

    Returns:
        ``(T, H, W)`` bool, where an object covers each frame.
    """
    steps, height, width = background.shape[:3]
    masks = np.zeros((steps, height, width), bool)
    if not objects:
        return masks
    obj_h, obj_w = size
    source = _load_photo(image, "object_image").astype(np.float32)
    yy, xx = np.mgrid[0:obj_h, 0:obj_w]
    ellipse = ((yy - (obj_h - 1) / 2) / (obj_h / 2)) ** 2 + (
        (xx - (obj_w - 1) / 2) / (obj_w / 2)
    ) ** 2 <= 1.0
    limit = np.array([height - obj_h, width - obj_w])
    for _ in range(objects):
        texture = _random_patch(source, obj_h, obj_w, rng)
        pos = np.array([rng.integers(0, limit[0] + 1), rng.integers(0, limit[1] + 1)])
        vel = np.zeros(2, np.int64)
        while not vel.any():
            vel = rng.integers(-speed, speed + 1, size=2)
        for t in range(steps):
            if t > 0:
                for axis in range(2):  # bounce off the frame's edges
                    if not 0 <= pos[axis] + vel[axis] <= limit[axis]:
                        vel[axis] = -vel[axis]
                pos = np.clip(pos + vel, 0, limit)
            y0, x0 = int(pos[0]), int(pos[1])
            region = background[t, y0 : y0 + obj_h, x0 : x0 + obj_w]
            region[ellipse] = texture[ellipse]
            masks[t, y0 : y0 + obj_h, x0 : x0 + obj_w] |= ellipse
    return masks


def _ground_truth(
    motion: np.ndarray, object_masks: np.ndarray, scale: np.ndarray, half: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The ``moved`` and ``in_view`` masks of the module docstring."""
    steps, height, width = object_masks.shape
    moved = np.zeros((steps, height, width), bool)
    in_view = np.zeros((steps, height, width), bool)
    ys, xs = np.mgrid[0:height, 0:width]
    for t in range(1, steps):
        dy, dx = int(motion[t, 0]), int(motion[t, 1])
        src_y, src_x = ys + dy, xs + dx
        inside = (src_y >= 0) & (src_y < height) & (src_x >= 0) & (src_x < width)
        in_view[t] = inside
        source_was_object = np.zeros((height, width), bool)
        source_was_object[inside] = object_masks[t - 1][src_y[inside], src_x[inside]]
        moved[t] = object_masks[t] | source_was_object
        if scale[t] != scale[t - 1]:
            # True displacement: d_t + (p - m) * (s_{t-1} / s_t - 1).
            shrink = scale[t - 1] / scale[t] - 1.0
            deviation = np.maximum(np.abs((ys - half[0]) * shrink), np.abs((xs - half[1]) * shrink))
            moved[t] |= deviation >= 0.5
    return moved, in_view


def _check_args(
    num_frames: int,
    size: tuple[int, int],
    pan: tuple[int, int],
    jitter: int,
    zoom: float,
    objects: int,
    object_speed: int,
    noise: float,
) -> tuple[int, int]:
    """Validates the scalar arguments; returns ``(H, W)``."""
    if not isinstance(num_frames, (int, np.integer)) or num_frames < 1:
        raise ValueError(f"dcjax: num_frames must be a positive integer, got {num_frames!r}")
    try:
        height, width = (int(v) for v in size)
    except (TypeError, ValueError):
        raise ValueError(f"dcjax: size must be (height, width), got {size!r}") from None
    if height < 4 or width < 4:
        raise ValueError(f"dcjax: size must be at least (4, 4), got {size!r}")
    if len(tuple(pan)) != 2 or any(int(v) != v for v in pan):
        raise ValueError(f"dcjax: pan must be two whole numbers of pixels (vy, vx), got {pan!r}")
    if not isinstance(jitter, (int, np.integer)) or jitter < 0:
        raise ValueError(f"dcjax: jitter must be a non-negative integer, got {jitter!r}")
    if not -0.5 < zoom < 0.5:
        raise ValueError(f"dcjax: zoom must be a small relative change per frame, got {zoom!r}")
    if not isinstance(objects, (int, np.integer)) or objects < 0:
        raise ValueError(f"dcjax: objects must be a non-negative integer, got {objects!r}")
    if not isinstance(object_speed, (int, np.integer)) or object_speed < 1:
        raise ValueError(f"dcjax: object_speed must be a positive integer, got {object_speed!r}")
    if noise < 0:
        raise ValueError(f"dcjax: noise must be >= 0, got {noise!r}")
    return height, width


def _load_photo(image: str | np.ndarray, argument: str) -> np.ndarray:
    """A photo from skimage.data (by name) or an array, as (h, w, 3) uint8."""
    if isinstance(image, str):
        skimage_data = _import("skimage.data")
        loader = getattr(skimage_data, image, None)
        if not callable(loader) or image.startswith("_") or image == "download_all":
            raise ValueError(
                f"dcjax: {argument}={image!r} is not a photo in skimage.data; try 'astronaut', "
                "'coffee', 'chelsea', 'rocket' or 'hubble_deep_field', or pass an array"
            )
        try:
            array = np.asarray(loader())
        except Exception as error:  # skimage may need a download for some images
            raise ValueError(
                f"dcjax: {argument}={image!r} could not be loaded from skimage.data ({error})"
            ) from error
    else:
        array = np.asarray(image)
    if array.ndim == 2:
        array = np.stack([array] * 3, axis=-1)
    if array.ndim != 3 or array.shape[2] not in (3, 4) or array.dtype != np.uint8:
        raise ValueError(
            f"dcjax: {argument} must be an (h, w, 3) or (h, w) uint8 photo, "
            f"got {array.shape} {array.dtype}"
        )
    return np.ascontiguousarray(array[..., :3])


def _upscale(photo: np.ndarray, factor: float) -> np.ndarray:
    """Bilinear upscaling by ``factor`` (>= 1), rounded back to uint8."""
    resize = _import("skimage.transform").resize
    shape = (int(np.ceil(photo.shape[0] * factor)), int(np.ceil(photo.shape[1] * factor)))
    out = resize(
        photo, shape + (3,), order=1, mode="edge", anti_aliasing=False, preserve_range=True
    )
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def _sample(
    canvas: np.ndarray,
    centre: np.ndarray,
    half: np.ndarray,
    scale: float,
    height: int,
    width: int,
) -> np.ndarray:
    """Bilinear sample of the canvas at ``centre + (p - half) / scale``."""
    map_coordinates = _import("scipy.ndimage").map_coordinates
    ys = centre[0] + (np.arange(height) - half[0]) / scale
    xs = centre[1] + (np.arange(width) - half[1]) / scale
    grid_y, grid_x = np.meshgrid(ys, xs, indexing="ij")
    out = np.empty((height, width, 3), np.float32)
    for channel in range(3):
        out[..., channel] = map_coordinates(
            canvas[..., channel], [grid_y, grid_x], order=1, mode="nearest"
        )
    return out


def _random_patch(
    source: np.ndarray, height: int, width: int, rng: np.random.Generator
) -> np.ndarray:
    """A random (height, width) crop of ``source`` (tiled if it is too small)."""
    if source.shape[0] < height or source.shape[1] < width:
        reps = (-(-height // source.shape[0]), -(-width // source.shape[1]), 1)
        source = np.tile(source, reps)
    top = int(rng.integers(0, source.shape[0] - height + 1))
    left = int(rng.integers(0, source.shape[1] - width + 1))
    return source[top : top + height, left : left + width]


def _import(module: str) -> ModuleType:
    """Imports an optional dependency of the generator, naming the extra if missing."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"dcjax.video.synthetic needs {module} (scikit-image): pip install 'dcjax[video]'"
        ) from error
