"""Writes mobilenet_v2_torch.npz: torchvision MobileNetV2's ImageNet probabilities on
scikit-image's ``chelsea`` and ``coffee`` photos (resized, short side 256, centre
crop 224, as ``tests/models/test_pretrained.py`` prepares them), computed by an
independent implementation: torch.nn.functional on the raw state dict, without
torchvision and without dcjax's reader. Run by hand, in an environment with torch:

    python tests/models/data/make_mobilenet_v2_reference.py CHECKPOINT.pth PHOTOS.npy

where PHOTOS.npy holds the two uint8 crops, (2, 224, 224, 3).
"""

import pathlib
import sys

import numpy as np
import torch
import torch.nn.functional as F

# (expansion, channels, repeats, stride) of the paper's Table 2.
SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
            (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]  # fmt: skip
MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)

state = torch.load(sys.argv[1], map_location="cpu")


def bn(x, p):
    s = state
    return F.batch_norm(x, s[p + ".running_mean"], s[p + ".running_var"], s[p + ".weight"],
                        s[p + ".bias"], False, 0.0, 1e-5)  # fmt: skip


def conv(x, p, stride=1, groups=1):
    w = state[p + ".weight"]
    return F.conv2d(x, w, None, stride, w.shape[-1] // 2, 1, groups)


frames = np.load(sys.argv[2]).astype(np.float32) / 255.0
x = torch.from_numpy(((frames - MEAN) / STD).transpose(0, 3, 1, 2).copy())
with torch.no_grad():
    x = F.relu6(bn(conv(x, "features.0.0", 2), "features.0.1"))
    i = 1
    for t, c, n, s in SETTINGS:
        for r in range(n):
            stride = s if r == 0 else 1
            p = f"features.{i}.conv."
            y, d = x, 0
            if t != 1:
                y, d = F.relu6(bn(conv(y, p + "0.0"), p + "0.1")), 1
            y = F.relu6(bn(conv(y, p + f"{d}.0", stride, y.shape[1]), p + f"{d}.1"))
            y = bn(conv(y, p + f"{d + 1}"), p + f"{d + 2}")
            x = x + y if (stride == 1 and x.shape[1] == c) else y
            i += 1
    x = F.relu6(bn(conv(x, "features.18.0"), "features.18.1")).mean((2, 3))
    probs = torch.softmax(F.linear(x, state["classifier.1.weight"], state["classifier.1.bias"]), -1)
out = pathlib.Path(__file__).with_name("mobilenet_v2_torch.npz")
np.savez_compressed(out, probs=probs.numpy(), torch=np.array(torch.__version__))
print("wrote", out, "top-1", probs.numpy().argmax(-1))
