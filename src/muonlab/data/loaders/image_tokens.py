"""The ImageGPT loader of seed paper 004 (AF-Muon, App. J.7).

One image = one block of tokens_per_image RGB554 tokens with no extra target token,
shuffled per seed with drop_last exactly as `MemmapBlockLoader` (the reference's DataLoader
order); batches are (inputs, targets, epoch) after the SOS shift. Eval: in file order,
drop_last, e.g. 16 batches of 256 images (4,194,304 tokens) in the paper; the loss is the
mean of per-batch means, bits/dim = loss / (3 ln 2). The files are written by
`muonlab.data.images`.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from muonlab.data.images import sos_shift, tokens_per_image
from muonlab.data.loaders.token_blocks import BlockLoaderView, MemmapBlockLoader
from muonlab.data.memmap_format import open_memmap


class ImageTokenLoader(BlockLoaderView):
    """Seed 004 ImageGPT batches: (inputs, targets, epoch), int64 [B, tokens_per_image].

    inputs = [SOS, x1 .. x_{n-1}], targets = x1 .. xn (`shift=False`: (tokens, epoch)).
    Images are shuffled per seed with drop_last and resumed exactly through
    `state_dict()` / `load_state_dict()` (a `MemmapBlockLoader` underneath).
    `num_images` caps the images used (the reference: min(train images, steps x batch)).
    """

    def __init__(self, memmap, batch_size: int, seed: int = 0, shuffle: bool = True, drop_last: bool = True,
                 num_images: int | None = None, shift: bool = True, rank: int = 0, world_size: int = 1,
                 device: str | torch.device = "cpu"):
        mm = open_memmap(memmap)
        self.tokens_per_image = tokens_per_image(mm)
        self.shift = bool(shift)
        self.blocks = MemmapBlockLoader(mm, self.tokens_per_image, batch_size, seed, drop_last=drop_last,
                                        with_target=False, shuffle=shuffle, num_blocks=num_images,
                                        rank=rank, world_size=world_size, device=device)

    def __next__(self):
        tokens, epoch = self.blocks.next_blocks()
        if self.shift:
            return (*sos_shift(tokens), epoch)
        return tokens, epoch


def image_eval_batches(memmap, batch_size: int, max_batches: int | None = None, shift: bool = True,
                       device: str | torch.device = "cpu") -> Iterator:
    """One in-order pass over an eval image file: (inputs, targets) (or tokens), drop_last.

    The paper's eval is max_batches=16 at batch_size=256 (4,194,304 tokens).
    """
    loader = ImageTokenLoader(memmap, batch_size, shuffle=False, drop_last=True, shift=shift, device=device)
    count = loader.batches_per_epoch if max_batches is None else min(max_batches, loader.batches_per_epoch)
    for _ in range(count):
        yield next(loader)[:-1] if shift else next(loader)[0]
