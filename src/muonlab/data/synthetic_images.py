"""Seeded synthetic images for ImageGPT's CPU presets (not ImageNet: stated wherever used).

Each image is a background of one colour with one to three solid rectangles on it, every colour
drawn from one 64-colour palette of the seed: neighbouring pixels are strongly correlated and
the colours recur across images, so a small model learns something in seconds and the
validation images use the training images' colours (a palette over all 16,384 RGB554 colours
would leave most validation colours unseen in a CPU-sized run). uint8 [N, size, size, 3].
"""

from __future__ import annotations

import numpy as np

PALETTE = 64


def synthetic_images(n: int, size: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    palette = rng.integers(0, 256, (PALETTE, 3))
    out = np.empty((n, size, size, 3), dtype=np.uint8)
    for i in range(n):
        img = np.broadcast_to(palette[rng.integers(PALETTE)], (size, size, 3)).copy()
        for _ in range(int(rng.integers(1, 4))):
            y0, x0 = rng.integers(0, size - 1, 2)
            h, w = rng.integers(1, max(2, size // 2) + 1, 2)
            img[y0:y0 + h, x0:x0 + w] = palette[rng.integers(PALETTE)]
        out[i] = img.astype(np.uint8)
    return out
