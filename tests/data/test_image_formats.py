"""Seed 004's image data in the forms it is published in (App. J.7): ImageNet-32's `.npz` batches
(`data` rows of three colour planes, with `labels`), the Hugging Face image parquet the paper
downloaded (`benjamin-paine/imagenet-1k-32x32`: an `image` column of {bytes, path} structs), and
globs or folders of either. Each is checked against the images it was written from."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from muonlab.cli import main
from muonlab.data.images import count_images, iter_image_chunks, load_image_arrays, rgb554_encode, write_image_tokens
from muonlab.errors import UsageError

Image = pytest.importorskip("PIL.Image")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _images(n, side, seed):
    return np.random.default_rng(seed).integers(0, 256, size=(n, side, side, 3), dtype=np.uint8)


def _published_rows(images):
    """ImageNet-32's row layout, written out plane by plane: all red values (row-major), then green, then blue."""
    n = len(images)
    return np.concatenate([images[..., 0].reshape(n, -1), images[..., 1].reshape(n, -1),
                           images[..., 2].reshape(n, -1)], axis=1)


def _png(image) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return buf.getvalue()


def _write_parquet(path, images, row_group_size, struct=True):
    cells = [{"bytes": _png(im), "path": f"{i}.png"} if struct else _png(im) for i, im in enumerate(images)]
    table = pa.table({"image": cells, "label": list(range(len(images)))})
    pq.write_table(table, path, row_group_size=row_group_size)


def test_imagenet32_published_npz_rows_are_three_colour_planes(tmp_path):
    images = _images(7, 4, 0)
    np.savez(tmp_path / "val_data.npz", data=_published_rows(images), labels=np.arange(1, 8))
    assert np.array_equal(load_image_arrays(tmp_path / "val_data.npz"), images)
    np.savez(tmp_path / "odd.npz", data=np.zeros((2, 50), np.uint8), labels=np.arange(2))
    with pytest.raises(UsageError, match="not three square colour planes"):
        load_image_arrays(tmp_path / "odd.npz")


def test_a_folder_of_batches_reads_in_natural_order(tmp_path):
    batches = [_images(3, 4, seed) for seed in range(11)]
    folder = tmp_path / "Imagenet32_train_npz"
    folder.mkdir()
    for k, b in enumerate(batches, 1):  # train_data_batch_1 .. _11: 10 sorts after 9, not after 1
        np.savez(folder / f"train_data_batch_{k}.npz", data=_published_rows(b), labels=np.arange(3), mean=np.zeros(3))
    want = np.concatenate(batches)
    assert count_images(folder) == 33
    got = np.concatenate(list(iter_image_chunks(folder, chunk_size=5)))  # chunks straddle the files
    assert np.array_equal(got, want)
    mm = write_image_tokens(tmp_path / "t.bin", folder, chunk_size=4)
    assert np.array_equal(mm.read(0, mm.num_tokens), rgb554_encode(want).reshape(-1))


@pytest.mark.parametrize("struct", [True, False])
def test_image_parquet_is_read_a_row_group_at_a_time(tmp_path, struct):
    images = _images(10, 4, 3)
    _write_parquet(tmp_path / "train-00000-of-00001.parquet", images, row_group_size=3, struct=struct)
    assert count_images(tmp_path / "train-00000-of-00001.parquet") == 10
    got = np.concatenate(list(iter_image_chunks(tmp_path / "train-00000-of-00001.parquet", chunk_size=4)))
    assert np.array_equal(got, images)  # PNG is lossless: the pixels come back exactly


def test_a_glob_names_one_split_of_a_download(tmp_path):
    train, val = _images(9, 4, 4), _images(4, 4, 5)
    data = tmp_path / "data"
    data.mkdir()
    _write_parquet(data / "train-00000-of-00002.parquet", train[:5], 2)
    _write_parquet(data / "train-00001-of-00002.parquet", train[5:], 2)
    _write_parquet(data / "validation-00000-of-00001.parquet", val, 2)
    assert np.array_equal(np.concatenate(list(iter_image_chunks(str(data / "train-*.parquet"), 3))), train)
    assert count_images(str(data / "validation-*.parquet")) == 4
    with pytest.raises(UsageError, match="no file matches"):
        count_images(str(data / "test-*.parquet"))
    pq.write_table(pa.table({"label": [1, 2]}), data / "labels.parquet")
    with pytest.raises(UsageError, match="no 'image' column"):
        count_images(data / "labels.parquet")


def test_imagegpt_trains_on_parquet_splits_from_the_command_line(tmp_path, capsys):
    """The paper's layout (train and validation parquet shards) reaches the ImageGPT through --path and
    --eval-path globs; the token files hold exactly the images' RGB554 codes."""
    train, val = _images(40, 8, 6), _images(8, 8, 7)
    data = tmp_path / "imagenet" / "data"
    data.mkdir(parents=True)
    _write_parquet(data / "train-00000-of-00001.parquet", train, 16)
    _write_parquet(data / "validation-00000-of-00001.parquet", val, 16)
    cache, runs = tmp_path / "cache", tmp_path / "runs"
    rc = main(["train", "--preset", "imagegpt-cpu", "--source", "images", "--path", str(data / "train-*"),
               "--eval-path", str(data / "validation-*"), "--num-steps", "2", "--quiet",
               "--cache-dir", str(cache), "--runs-dir", str(runs)])
    assert rc == 0, capsys.readouterr().err
    (train_bin,) = cache.rglob("train.bin")
    from muonlab.data.memmap_format import TokenMemmap

    mm, ev = TokenMemmap(train_bin), TokenMemmap(train_bin.with_name("eval.bin"))
    assert np.array_equal(mm.read(0, mm.num_tokens), rgb554_encode(train).reshape(-1))
    assert np.array_equal(ev.read(0, ev.num_tokens), rgb554_encode(val).reshape(-1))
    record = json.loads((runs / "ledger.jsonl").read_text().splitlines()[-1])
    assert record["status"] == "ok"
