"""RGB554 image tokens and their token files: the ImageGPT setting of seed paper 004 (AF-Muon).

Seed 004 App. J.7: ImageNet-32 images become 1,024 raster-order colour
tokens, token = (R>>3)*512 + (G>>3)*16 + (B>>4) (5 bits red, 5 green, 4 blue: 16,384
colours). The model sees [SOS, x1 .. x1023] with SOS = 16,384 (an input-only row, so the
tied table has 16,385 rows) and predicts x1 .. x1024 against the 16,384 colour rows only.
`rgb554_encode`, `RGB554_VOCAB` and `SOS` here are the single definition of that code;
model files import them.

Choices:

* Inputs, each read a chunk at a time (memory bounded by one file of arrays, or one parquet
  row group, never the dataset):
  - uint8 arrays [N, H, W, 3]: in memory, `.npy`, or `.npz` with one array or an `images`
    array (never unpickled);
  - ImageNet-32/64 as published (downsampled ImageNet, Chrabaszcz et al. 2017): `.npz` with
    `data` uint8 [N, 3*S*S], each row the red plane, then green, then blue, row-major
    (`labels`, `mean` are ignored), e.g. `train_data_batch_1.npz` .. `_10.npz` and `val_data.npz`;
  - image parquet, the form of `benjamin-paine/imagenet-1k-32x32` (the paper's source, App.
    J.7): an `image` column of {bytes, path} structs (or plain binary) holding PNG/JPEG bytes;
  - a folder of PNG/JPEG files.
  A folder holding `.npy`/`.npz`/`.parquet` files is read as those files in natural order
  (batch_2 before batch_10); a path with `*` is a glob, so `--path 'data/train-*.parquet'
  --eval-path 'data/validation-*.parquet'` reads one download's two splits. Images are decoded
  with Pillow, which this environment has through matplotlib (no dependency is added; without
  Pillow an image folder or parquet raises UsageError and arrays still work). Folder files
  are taken recursively in sorted relative-path order, converted to RGB as the reference does
  (`image.convert("RGB")`), and must all have one size: nothing is resized. Other dtypes
  than uint8 are refused rather than guessed (0..1 floats vs 0..255 ints).
* Storage: the colour tokens only (SOS is never stored), uint16 token memmaps through
  `memmap_format.py`, `tokenizer = "rgb554"`, `vocab_size = 16384`, and `extra` =
  {kind, tokens_per_image, image_height, image_width, images, sos}. The eval split is a
  separate file: the dataset's validation split (as the paper) or, failing that, a seeded
  random hold-out of `eval_images` images (`prepare_image_tokens`).
* Loading: `muonlab.data.loaders.image_tokens` batches these files for the ImageGPT.
"""

from __future__ import annotations

import contextlib
import glob
import io
import math
import os
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from muonlab.data.memmap_format import TokenMemmap, TokenMemmapWriter, open_memmap
from muonlab.errors import CorruptInput, UsageError

RGB554_VOCAB = 16384  # colour tokens 0 .. 16383
SOS = 16384  # start-of-image token: an input-only row of the tied table
IMAGE_VOCAB = RGB554_VOCAB + 1  # rows of the model's token table
TOKENIZER_NAME = "rgb554"
IMAGE_KIND = "rgb554-images"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
FILE_SUFFIXES = (".npy", ".npz", ".parquet")  # files that hold many images each


# --- the code ---------------------------------------------------------------------------
def rgb554_encode(images: Any) -> Any:
    """uint8 RGB [..., 3] (numpy or torch) -> int64 tokens [...] = (R>>3)*512 + (G>>3)*16 + (B>>4).

    Returns the same kind (numpy array or tensor, same device) with the last axis removed;
    flatten an [N, H, W] result to [N, H*W] for raster order.
    """
    if isinstance(images, torch.Tensor):
        if images.dtype != torch.uint8 or images.ndim < 1 or images.shape[-1] != 3:
            raise UsageError(f"rgb554_encode needs uint8 [..., 3] pixels, got {images.dtype} {tuple(images.shape)}")
        px = images.to(torch.int64)
    else:
        images = np.asarray(images)
        if images.dtype != np.uint8 or images.ndim < 1 or images.shape[-1] != 3:
            raise UsageError(f"rgb554_encode needs uint8 [..., 3] pixels, got {images.dtype} {images.shape}")
        px = images.astype(np.int64)
    return (px[..., 0] >> 3) * 512 + (px[..., 1] >> 3) * 16 + (px[..., 2] >> 4)


def rgb554_decode(tokens: Any) -> Any:
    """Tokens [...] -> uint8 RGB [..., 3] at the centre of each colour bin (for viewing)."""
    t = tokens.to(torch.int64) if isinstance(tokens, torch.Tensor) else np.asarray(tokens, dtype=np.int64)
    if t.numel() if isinstance(t, torch.Tensor) else t.size:
        if int(t.min()) < 0 or int(t.max()) >= RGB554_VOCAB:
            raise UsageError(f"RGB554 tokens must lie in [0, {RGB554_VOCAB})")
    r, g, b = ((t >> 9) << 3) | 4, (((t >> 4) & 31) << 3) | 4, ((t & 15) << 4) | 8
    if isinstance(t, torch.Tensor):
        return torch.stack([r, g, b], dim=-1).to(torch.uint8)
    return np.stack([r, g, b], axis=-1).astype(np.uint8)


def sos_shift(tokens: torch.Tensor, sos: int = SOS) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of image tokens [B, n]: inputs = [sos, x1 .. x_{n-1}], targets = x1 .. xn."""
    start = torch.full((tokens.shape[0], 1), int(sos), dtype=tokens.dtype, device=tokens.device)
    return torch.cat([start, tokens[:, :-1]], dim=1), tokens


# --- image sources ----------------------------------------------------------------------
def _check_images(arr: np.ndarray, where: str) -> np.ndarray:
    if arr.dtype != np.uint8 or arr.ndim != 4 or arr.shape[-1] != 3:
        raise UsageError(f"{where}: images must be uint8 [N, H, W, 3], got {arr.dtype} {arr.shape}")
    return arr


def planar_rows_to_images(data: np.ndarray, where: str) -> np.ndarray:
    """ImageNet-32/64's published rows [N, 3*S*S] (R plane, G plane, B plane) -> [N, S, S, 3] (a view)."""
    if data.dtype != np.uint8 or data.ndim != 2:
        raise UsageError(f"{where}: 'data' must be uint8 [N, 3*S*S], got {data.dtype} {data.shape}")
    side = math.isqrt(data.shape[1] // 3)
    if 3 * side * side != data.shape[1]:
        raise UsageError(f"{where}: rows of {data.shape[1]} values are not three square colour planes")
    return data.reshape(len(data), 3, side, side).transpose(0, 2, 3, 1)


def load_image_arrays(path: str | os.PathLike) -> np.ndarray:
    """uint8 [N, H, W, 3] from a .npy (memory-mapped) or .npz file: an `images` array, ImageNet's
    published `data` rows (with `labels`), or the file's only array."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"missing image array file {path}")
    magic = {".npy": b"\x93NUMPY", ".npz": b"PK"}.get(path.suffix)  # numpy's own formats (npz is a zip)
    if magic is not None:
        with open(path, "rb") as f:
            if f.read(len(magic)) != magic:  # numpy would say "pickled data ... allow_pickle": never unpickle
                raise CorruptInput(f"{path} is not a {path.suffix} array file (it does not begin as numpy writes "
                                   f"one): write it with numpy.{'save' if path.suffix == '.npy' else 'savez'}")
    try:
        if path.suffix == ".npy":
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        elif path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                keys = list(z.files)
                data = z["data"] if "data" in keys and "images" not in keys else None  # read once
                if "images" in keys:
                    arr = z["images"]
                elif data is not None and data.ndim == 2:
                    return planar_rows_to_images(data, str(path))
                elif len(keys) == 1:
                    arr = z[keys[0]]
                else:
                    raise UsageError(f"{path} holds arrays {keys}; name the image array 'images' (or ImageNet's "
                                     f"'data' rows)")
        else:
            raise UsageError(f"{path}: image arrays must be .npy or .npz files")
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:  # truncated, or not numpy's format at all
        raise CorruptInput(f"{path} is not a readable {path.suffix} array file ({e.__class__.__name__}: {e}): "
                           "write it with numpy.save/savez") from None
    return _check_images(arr, str(path))


def _pillow():
    try:
        from PIL import Image, UnidentifiedImageError  # noqa: PLC0415
    except ImportError:
        raise UsageError("decoding PNG/JPEG images needs Pillow (pip install pillow); .npy/.npz uint8 arrays "
                         "need nothing") from None
    return Image, UnidentifiedImageError


def _decode(data: bytes, where: str) -> np.ndarray:
    Image, Unidentified = _pillow()
    try:
        with Image.open(io.BytesIO(data)) as im:
            return np.asarray(im.convert("RGB"), dtype=np.uint8)
    except (Unidentified, OSError, ValueError) as e:
        raise UsageError(f"undecodable image in {where}: {e}") from None


class _ParquetImages:
    """An image parquet file: its `image` column (or its only binary/struct column), a row group
    at a time; cells are {bytes, path} structs (the Hugging Face Image feature) or raw bytes."""

    def __init__(self, path: Path):
        import pyarrow as pa  # noqa: PLC0415
        import pyarrow.parquet as pq  # noqa: PLC0415

        self.path = path
        try:
            self.file = pq.ParquetFile(path)
        except (pa.ArrowException, OSError) as e:
            raise UsageError(f"unreadable parquet file {path}: {e}") from None
        schema = self.file.schema_arrow
        candidates = [f.name for f in schema if pa.types.is_struct(f.type) or pa.types.is_binary(f.type)
                      or pa.types.is_large_binary(f.type)]
        self.column = "image" if "image" in schema.names else candidates[0] if len(candidates) == 1 else None
        if self.column is None:
            raise UsageError(f"{path} has no 'image' column (columns: {', '.join(schema.names)})")
        sizes = [self.file.metadata.row_group(g).num_rows for g in range(self.file.num_row_groups)]
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.size: tuple[int, int] | None = None

    def __len__(self) -> int:
        return int(self.starts[-1])

    def read(self, a: int, b: int) -> np.ndarray:
        out = []
        for g in range(int(np.searchsorted(self.starts, a, side="right")) - 1, self.file.num_row_groups):
            lo, hi = int(self.starts[g]), int(self.starts[g + 1])
            if lo >= b:
                break
            cells = self.file.read_row_group(g, columns=[self.column]).column(0).to_pylist()
            for cell in cells[max(a, lo) - lo : min(b, hi) - lo]:
                data = cell.get("bytes") if isinstance(cell, dict) else cell
                if not data:
                    raise UsageError(f"{self.path}: an image cell without bytes (column {self.column!r})")
                arr = _decode(data, str(self.path))
                if self.size is not None and arr.shape[:2] != self.size:
                    raise UsageError(f"{self.path}: a {arr.shape[1]}x{arr.shape[0]} image among "
                                     f"{self.size[1]}x{self.size[0]} ones; resize first")
                self.size = arr.shape[:2]
                out.append(arr)
        if not out:
            return np.zeros((0, 1, 1, 3), dtype=np.uint8)
        return np.stack(out)


def _natural_key(path: Path) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.as_posix())]


def image_files(source: str | os.PathLike) -> list[Path] | None:
    """The array/parquet files a path names (a glob, or a folder holding such files), in natural
    order; None for a single file or a folder of PNG/JPEG images."""
    text = str(source)
    if "*" in text or "?" in text:
        files = [Path(f) for f in glob.glob(os.path.expanduser(text), recursive=True) if Path(f).is_file()]
        if not files:
            raise UsageError(f"no file matches {text}")
    else:
        folder = Path(source)
        if not folder.is_dir():
            return None
        files = [p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in FILE_SUFFIXES]
        if not files:
            return None
    bad = [f for f in files if f.suffix.lower() not in FILE_SUFFIXES]
    if bad:
        raise UsageError(f"{bad[0]} is not a {'/'.join(FILE_SUFFIXES)} file of images")
    return sorted(files, key=_natural_key)


def list_image_files(folder: str | os.PathLike) -> list[Path]:
    """PNG/JPEG files under `folder` (recursive), sorted by relative path."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UsageError(f"missing image folder {folder}")
    files = [p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]
    if not files:
        raise UsageError(f"{folder} holds no {'/'.join(IMAGE_SUFFIXES)} files")
    return sorted(files, key=lambda p: p.relative_to(folder).as_posix())


def _read_images(files: list[Path], size: tuple[int, int] | None) -> np.ndarray:
    out = []
    for f in files:
        arr = _decode(f.read_bytes(), str(f))
        if size is not None and arr.shape[:2] != size:
            raise UsageError(f"{f} is {arr.shape[1]}x{arr.shape[0]}, the others are {size[1]}x{size[0]}; resize first")
        size = arr.shape[:2]
        out.append(arr)
    return np.stack(out)


def load_image_folder(folder: str | os.PathLike) -> np.ndarray:
    """All PNG/JPEG images under `folder` as uint8 [N, H, W, 3] (needs Pillow; one size)."""
    return _read_images(list_image_files(folder), None)


def _file_source(path: Path) -> tuple[int, Any]:
    if path.suffix.lower() == ".parquet":
        table = _ParquetImages(path)
        return len(table), table.read
    arr = load_image_arrays(path)
    return len(arr), lambda a, b: np.asarray(arr[a:b])


def _concatenated(files: list[Path]) -> tuple[int, Any]:
    """Files read one after another as one sequence of images; a file is opened when first read
    (one .npz's arrays in memory at a time)."""
    counts = []
    for f in files:  # parquet and .npy counts are metadata; an .npz is opened to count
        counts.append(_file_source(f)[0])
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    opened: dict[int, Any] = {}

    def read(a: int, b: int) -> np.ndarray:
        parts = []
        for i, f in enumerate(files):
            lo, hi = int(starts[i]), int(starts[i + 1])
            if hi <= a or lo >= b:
                continue
            if i not in opened:
                opened.clear()
                opened[i] = _file_source(f)[1]
            parts.append(opened[i](max(a, lo) - lo, min(b, hi) - lo))
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    return int(starts[-1]), read


def _source(source: Any) -> tuple[int, Any]:
    """(image count, reader(start, stop) -> uint8 [n, H, W, 3]) of an array, file, glob or folder."""
    if isinstance(source, torch.Tensor):
        source = source.cpu().numpy()
    if isinstance(source, np.ndarray):
        arr = _check_images(source, "image array")
        return len(arr), lambda a, b: np.asarray(arr[a:b])
    files = image_files(source)
    if files is not None:
        return _concatenated(files)
    path = Path(source)
    if path.is_dir():
        files = list_image_files(path)
        first = _read_images(files[:1], None)
        size = first.shape[1:3]
        return len(files), lambda a, b: _read_images(files[a:b], size)
    if not path.is_file():
        raise UsageError(f"missing image source {path}")
    return _file_source(path)


def source_files(source: str | os.PathLike) -> list[tuple[str, int, int]]:
    """(path, size, mtime_ns) of every file an image source names: what decides its token files."""
    files = image_files(source)
    if files is None:
        path = Path(source).expanduser()
        files = list_image_files(path) if path.is_dir() else [path] if path.is_file() else []
    if not files:
        raise UsageError(f"missing image source {source}")
    return [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files]


def count_images(source: Any) -> int:
    """Images in an array, .npy/.npz file or folder, without decoding a folder's files."""
    return _source(source)[0]


def iter_image_chunks(source: Any, chunk_size: int = 4096) -> Iterator[np.ndarray]:
    """uint8 [<= chunk_size, H, W, 3] chunks of an array, .npy/.npz file or image folder."""
    n, read = _source(source)
    for start in range(0, n, chunk_size):
        yield read(start, min(n, start + chunk_size))


# --- token files ------------------------------------------------------------------------
def _image_extra(h: int, w: int, images: int, source: str) -> dict:
    return {"kind": IMAGE_KIND, "tokens_per_image": h * w, "image_height": h, "image_width": w,
            "images": images, "sos": SOS, "source": source}


@contextlib.contextmanager
def _image_writer(path: Path, source: str):
    writer = TokenMemmapWriter(path, RGB554_VOCAB, TOKENIZER_NAME, "uint16", _image_extra(0, 0, 0, source))
    with writer:
        yield writer
        if writer.entry["extra"]["images"] == 0:
            raise UsageError(f"no images to write to {path}")


def _append_images(writer: TokenMemmapWriter, chunk: np.ndarray) -> None:
    if len(chunk) == 0:
        return
    extra = writer.entry["extra"]
    h, w = chunk.shape[1:3]
    if extra["images"] and (extra["image_height"], extra["image_width"]) != (h, w):
        raise UsageError(f"{writer.path}: {w}x{h} images after {extra['image_width']}x{extra['image_height']} ones")
    writer.append(rgb554_encode(chunk).reshape(len(chunk), -1))
    extra.update(image_height=h, image_width=w, tokens_per_image=h * w, images=extra["images"] + len(chunk))


def write_image_tokens(path: str | os.PathLike, source: Any, chunk_size: int = 4096) -> TokenMemmap:
    """RGB554-encode every image of `source` (array, .npy/.npz, folder) into a token memmap."""
    path = Path(path)
    with _image_writer(path, str(source) if not isinstance(source, (np.ndarray, torch.Tensor)) else "array") as w:
        for chunk in iter_image_chunks(source, chunk_size):
            _append_images(w, chunk)
    return TokenMemmap(path)


def prepare_image_tokens(
    out_dir: str | os.PathLike,
    train_source: Any,
    eval_source: Any = None,
    eval_images: int = 0,
    seed: int = 0,
    chunk_size: int = 4096,
) -> tuple[TokenMemmap, TokenMemmap]:
    """Write out_dir/train.bin and out_dir/eval.bin (+ metadata.json); return them opened.

    The eval split is `eval_source` when given (the paper: ImageNet-32 validation);
    otherwise `eval_images` images of `train_source` chosen by a seeded permutation are
    held out, and both files keep the source order.
    """
    out_dir = Path(out_dir)
    train_path, eval_path = out_dir / "train.bin", out_dir / "eval.bin"
    if eval_source is not None:
        if eval_images:
            raise UsageError("give either eval_source or eval_images, not both")
        train = write_image_tokens(train_path, train_source, chunk_size)
        return train, write_image_tokens(eval_path, eval_source, chunk_size)
    n, read = _source(train_source)
    if not 0 < eval_images < n:
        raise UsageError(f"eval_images must be in [1, {n - 1}] to hold out from {n} images, got {eval_images}")
    held = np.zeros(n, dtype=bool)
    held[np.random.default_rng(seed).permutation(n)[:eval_images]] = True
    name = str(train_source) if not isinstance(train_source, (np.ndarray, torch.Tensor)) else "array"
    with _image_writer(train_path, name) as tw, _image_writer(eval_path, f"{name} (held out, seed {seed})") as ew:
        tw.entry["extra"]["held_out"] = {"images": int(eval_images), "seed": int(seed)}
        for start in range(0, n, chunk_size):
            chunk = read(start, min(n, start + chunk_size))
            mask = held[start : start + len(chunk)]
            _append_images(tw, chunk[~mask])
            _append_images(ew, chunk[mask])
    return TokenMemmap(train_path), TokenMemmap(eval_path)


def tokens_per_image(memmap: "TokenMemmap | str | os.PathLike") -> int:
    """Tokens per image of an RGB554 token file (its metadata); UsageError for other files."""
    mm = open_memmap(memmap)
    if mm.tokenizer != TOKENIZER_NAME or mm.extra.get("kind") != IMAGE_KIND:
        raise UsageError(f"{mm.path} is not an RGB554 image token file (tokenizer {mm.tokenizer!r})")
    n = mm.extra.get("tokens_per_image")
    if not isinstance(n, int) or n < 2 or mm.num_tokens % n:
        raise UsageError(f"{mm.path}: tokens_per_image={n!r} does not divide its {mm.num_tokens} tokens")
    return n
