"""Seed 004's ImageGPT (Table 1 row 8, App. J.7): the tied GPT on RGB554 colour tokens, scored in
validation loss, bits per dimension (loss / 3 ln 2) and the top-half completion loss (Table 23).

Data (`data.source`): `images` (a folder of PNG/JPEG or a .npy/.npz uint8 [N, H, W, 3];
`--eval-path` the evaluation images, else val_fraction of them held out by a seeded draw),
`memmap` (RGB554 token files written by `muonlab prepare`: train.bin and eval.bin or val.bin), or
`synthetic_images` (seeded gradients and rectangles for the CPU presets; not ImageNet). One image
is one example: train.sequence_len must equal its pixel count (1,024 at 32 x 32).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch

from muonlab.errors import UsageError
from muonlab.families import Family, register_family
from muonlab.families.tied.afmuon import AFMuonConfig, LRSchedule, build_optimizer, cpu_matrix_lr, table_stats
from muonlab.families.tied.imagegpt.model import IMAGEGPT_SHAPES, ImageGPTModel
from muonlab.families.tied.token_family import evaluate_token_splits, tokens_dir
from muonlab.settings import Section, setting, validate_tree

IMAGEGPT_SHAPE_NAMES = tuple(IMAGEGPT_SHAPES)
IMAGE_SOURCES = ("images", "synthetic_images", "memmap")


@dataclass
class ImageGPTModelConfig(Section):
    """The ImageGPT's shape (the image size decides train.sequence_len)."""

    preset: Literal[IMAGEGPT_SHAPE_NAMES] = setting("imagegpt-cpu", "the ImageGPT's shape: imagegpt-tiny or imagegpt-cpu "
                                            "(8 x 8 images) or imagegpt (32 x 32, seed 004 App. J.7)", flag="imagegpt-preset")


def build_model(cfg, vocab_size: int, runtime):
    shape = IMAGEGPT_SHAPES[cfg.model.preset]
    with torch.device("meta"):  # the colours plus the input-only SOS row
        model = ImageGPTModel(replace(shape, vocab_size=vocab_size + 1))
    model.to_empty(device=runtime.device)
    model.init_weights()
    return model


def _loader(mm, B, T, seed, device, rank=0, world_size=1, shuffle=True, drop_last=True, num_images=None):
    from muonlab.data.images import tokens_per_image  # noqa: PLC0415
    from muonlab.data.loaders.image_tokens import ImageTokenLoader  # noqa: PLC0415

    if tokens_per_image(mm) != T:
        raise UsageError(f"{mm.path} holds images of {tokens_per_image(mm)} pixels; train.sequence_len is {T} "
                         f"(--sequence-len {tokens_per_image(mm)}, and an ImageGPT preset of that size)")
    return ImageTokenLoader(mm, B, seed=seed, shuffle=shuffle, drop_last=drop_last, num_images=num_images,
                            rank=rank, world_size=world_size, device=device)


def prepare_data(cfg, log=print):
    from muonlab.data.images import prepare_image_tokens  # noqa: PLC0415
    from muonlab.data.memmap_format import TokenMemmap  # noqa: PLC0415
    from muonlab.data.token_data import TokenData, memmap_folder, write_once  # noqa: PLC0415

    d = cfg.data
    validate_tree(d)  # its ranges, then its own checks
    if d.source == "memmap":
        return memmap_folder(d.path).with_batcher(_loader)
    if d.source == "synthetic_images":
        size = IMAGEGPT_SHAPES[cfg.model.preset].image_size
        identity = {"source": "synthetic_images", "images": d.synthetic_images, "size": size, "seed": d.synthetic_seed,
                    "val_fraction": d.val_fraction}
    else:
        from muonlab.data.images import source_files  # noqa: PLC0415

        if not d.path:
            raise UsageError("data source 'images' needs --path: a folder of PNG/JPEG, .npy/.npz arrays (ImageNet-32's "
                             "published batches too) or image parquet, or a glob of them (and --eval-path)")
        identity = {"source": "images", "files": [source_files(p) for p in (d.path, d.eval_path) if p],
                    "val_fraction": None if d.eval_path else d.val_fraction}

    def write(out) -> list[str]:  # train.bin and eval.bin (muonlab.data.images)
        if d.source == "synthetic_images":
            from muonlab.data.synthetic_images import synthetic_images  # noqa: PLC0415

            train = synthetic_images(d.synthetic_images, size, d.synthetic_seed)
            prepare_image_tokens(out, train, eval_images=max(1, round(len(train) * d.val_fraction)))
        elif d.eval_path:
            prepare_image_tokens(out, d.path, eval_source=d.eval_path)
        else:
            from muonlab.data.images import count_images  # noqa: PLC0415

            prepare_image_tokens(out, d.path, eval_images=max(1, round(count_images(d.path) * d.val_fraction)))
        return ["train", "eval"]

    out = tokens_dir(d, identity)
    write_once(out, write, log)
    files = {"train": TokenMemmap(out / "train.bin"), "val": TokenMemmap(out / "eval.bin")}
    return TokenData(d.source, files, "rgb554", identity=identity).with_batcher(_loader)


def evaluate(model, data, cfg, runtime, ctx, splits=("val", "holdout"), tokens=None):
    from muonlab.data.memmap_format import count_blocks  # noqa: PLC0415
    from muonlab.eval.loss import image_metrics  # noqa: PLC0415
    from muonlab.families.tied.token_family import eval_examples  # noqa: PLC0415

    def eval_loader(mm, B, T, n_tokens, device):
        n = eval_examples(mm, n_tokens, T, count_blocks(mm, T, with_target=False))
        return _loader(mm, B, T, 0, device, shuffle=False, drop_last=False, num_images=n)

    T = cfg.train.sequence_len
    return evaluate_token_splits(model, data, cfg, runtime, ctx, splits, tokens, eval_loader=eval_loader,
                                 completion_from=T // 2, finish=image_metrics)


def validate(cfg) -> None:
    size = IMAGEGPT_SHAPES[cfg.model.preset].image_size
    if cfg.train.sequence_len != size * size:
        raise UsageError(f"ImageGPT preset {cfg.model.preset} reads {size} x {size} images: --sequence-len must be "
                         f"{size * size}, got {cfg.train.sequence_len}")


_COMMON = {"family": "imagegpt", "optim.kind": "afmuon", "schedule.warmup_ratio": 0.0, "schedule.warmdown_ratio": 0.0,
           "train.grad_clip": 1.0, "train.loss_logged": "mean"}
PRESETS = {
    # seconds on a CPU: 8 x 8 synthetic images (64 tokens), 16 images a step; the Muon lr scaled to that
    # 1,024-token batch (cpu_matrix_lr: 0.02 * sqrt(1/512))
    "imagegpt-cpu": {**_COMMON, "model.preset": "imagegpt-cpu", "optim.matrix_lr": cpu_matrix_lr(16 * 64),
                     "train.sequence_len": 64,
                     "train.device_batch_size": 16, "train.total_batch_size": 16 * 64, "train.num_steps": 40,
                     "train.untimed_steps": 1, "train.eval_tokens": 64 * 64, "runtime.device": "cpu",
                     "runtime.precision": "fp32", "runtime.compile": "off", "record.log_every": 10,
                     "data.source": "synthetic_images", "data.synthetic_images": 1024},
    # seed 004 App. J.7: ImageNet 32 x 32 (give --path, and --eval-path for its validation split), 512 images
    # a step (micro 256 x 2), 2,500 steps, eval every 250 on 16 x 256 images (4,194,304 tokens)
    "imagegpt": {**_COMMON, "model.preset": "imagegpt", "train.sequence_len": 1024, "train.device_batch_size": 256,
                 "train.total_batch_size": 512 * 1024, "train.num_steps": 2500, "train.eval_every": 250,
                 "train.eval_tokens": 16 * 256 * 1024, "record.checkpoint_every": 250, "data.source": "images"},
}

register_family(Family(
    name="imagegpt", description="seed 004's tied ImageGPT on RGB554 colour tokens",
    model_config=ImageGPTModelConfig, optim_config=AFMuonConfig, build_model=build_model,
    build_optimizer=build_optimizer, schedule=LRSchedule,
    describe=lambda cfg: (f"imagegpt {cfg.model.preset}: width {IMAGEGPT_SHAPES[cfg.model.preset].n_embd}, "
                          f"depth {IMAGEGPT_SHAPES[cfg.model.preset].n_layer}"),
    depth=lambda cfg: IMAGEGPT_SHAPES[cfg.model.preset].n_layer, validate=validate, embedding_key="wte.weight",
    prepare_data=prepare_data, evaluate=evaluate, presets=PRESETS, metric="val_ce",
    summary_metrics=("val_ce", "val_bpd", "val_bits_per_token", "val_completion_nll", "val_completion_bpd"), final_metrics=table_stats,
    data_sources=IMAGE_SOURCES,
))
