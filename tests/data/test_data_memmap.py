"""Seed 004 data: token memmaps + metadata, block/T5/image loaders, RGB554 (generated data only)."""

import itertools
import json

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from muonlab.data.images import (
    IMAGE_VOCAB,
    RGB554_VOCAB,
    SOS,
    load_image_arrays,
    load_image_folder,
    prepare_image_tokens,
    rgb554_decode,
    rgb554_encode,
    sos_shift,
    write_image_tokens,
)
from muonlab.data.loaders.image_tokens import ImageTokenLoader, image_eval_batches
from muonlab.data.loaders.prefix_continuation import prefix_continuation_batches, prefix_continuation_eval_batches
from muonlab.data.loaders.token_blocks import MemmapBlockLoader, eval_batches
from muonlab.data.memmap_format import TokenMemmap, count_blocks, register_token_memmap, write_token_memmap
from muonlab.errors import UsageError


def ramp(tmp_path, n, name="train.bin", vocab=1 << 20):
    """A token file whose token at position i is i (so a block shows where it came from)."""
    return write_token_memmap(tmp_path / name, np.arange(n, dtype=np.int64), vocab, tokenizer="ramp")


def take(loader, k):
    return list(itertools.islice(loader, k))


# --- memmap files and metadata ----------------------------------------------------------
def test_write_read_roundtrip_and_schema(tmp_path):
    rng = np.random.default_rng(0)
    small = rng.integers(0, 50304, size=5000)
    mm = write_token_memmap(tmp_path / "train.bin", torch.from_numpy(small), 50304, tokenizer="smollm2")
    big = write_token_memmap(tmp_path / "eval.bin", (c for c in np.array_split(small + 70000, 3)), 151936,
                             tokenizer="qwen2.5", extra={"split": "eval"})
    assert mm.dtype == np.dtype("<u2") and big.dtype == np.dtype("<u4")
    assert (tmp_path / "train.bin").stat().st_size == 2 * 5000
    np.testing.assert_array_equal(mm.read(0, 5000), small)
    np.testing.assert_array_equal(TokenMemmap(tmp_path / "eval.bin").read(10, 5), small[10:15] + 70000)
    meta = json.loads((tmp_path / "metadata.json").read_text())
    assert meta["format"] == "muonlab-token-memmap" and meta["version"] == 1
    assert meta["files"]["train.bin"] == {"dtype": "uint16", "num_tokens": 5000, "vocab_size": 50304,
                                          "tokenizer": "smollm2", "extra": {}}
    assert meta["files"]["eval.bin"]["extra"] == {"split": "eval"}
    assert isinstance(mm.tokens, np.memmap) and not mm.tokens.flags.writeable
    assert not list(tmp_path.glob("*.tmp"))


def test_metadata_validation_names_the_file(tmp_path):
    mm = write_token_memmap(tmp_path / "train.bin", np.arange(100), 1000, tokenizer="t")
    meta_path = tmp_path / "metadata.json"
    good = json.loads(meta_path.read_text())

    def with_entry(**change):
        meta = json.loads(json.dumps(good))
        meta["files"]["train.bin"].update(change)
        meta_path.write_text(json.dumps(meta))

    for change, words in [
        ({"dtype": "int32"}, "dtype 'int32'"),
        ({"num_tokens": 99}, "bytes but metadata says 99"),
        ({"vocab_size": 50}, "token id 50 at position 50 is >= vocab_size 50"),
        ({"vocab_size": 70000}, "does not fit dtype uint16"),
        ({"tokenizer": ""}, "tokenizer"),
    ]:
        with_entry(**change)
        with pytest.raises(UsageError, match="train.bin") as e:
            TokenMemmap(mm.path)
        assert words in str(e.value)
    meta_path.write_text(json.dumps({"dtype": "uint16", "train_path": "train.bin"}))  # the reference's layout
    with pytest.raises(UsageError, match="register_token_memmap"):
        TokenMemmap(mm.path)
    meta_path.unlink()
    with pytest.raises(UsageError, match="missing .*metadata.json"):
        TokenMemmap(mm.path)


def test_bad_ids_refused_on_write_and_found_by_the_sampled_check(tmp_path):
    with pytest.raises(UsageError, match="token id 7 is outside"):
        write_token_memmap(tmp_path / "x.bin", [1, 2, 7], 7, tokenizer="t")
    with pytest.raises(UsageError, match="integers"):
        write_token_memmap(tmp_path / "x.bin", np.ones(3, dtype=np.float32), 7, tokenizer="t")
    assert not (tmp_path / "x.bin").exists() and not list(tmp_path.glob(".x.bin*"))
    n = 3_000_000  # larger than the 16 x 65,536-token sample, so only windows are read on open
    mm = write_token_memmap(tmp_path / "big.bin", np.zeros(n, dtype=np.uint16), 1000, tokenizer="t")
    with open(mm.path, "r+b") as f:  # corrupt the last token: the last sampled window ends at the end
        f.seek(2 * (n - 1))
        f.write(np.array([4000], dtype="<u2").tobytes())
    with pytest.raises(UsageError, match=r"big.bin: token id 4000 at position 2999999"):
        TokenMemmap(mm.path)
    with open(mm.path, "r+b") as f:  # an id between two windows: found only by the full scan
        f.seek(2 * (n - 1))
        f.write(np.array([0], dtype="<u2").tobytes())
        f.seek(2 * 100_000)
        f.write(np.array([4000], dtype="<u2").tobytes())
    opened = TokenMemmap(mm.path)
    with pytest.raises(UsageError, match="position 100000"):
        opened.validate(full=True)


def test_register_existing_bin(tmp_path):
    np.arange(300, dtype="<u4").tofile(tmp_path / "train_tokens_uint32.bin")
    mm = register_token_memmap(tmp_path / "train_tokens_uint32.bin", 70000, "llama3", "uint32")
    assert mm.num_tokens == 300 and mm.read(299, 1)[0] == 299
    with pytest.raises(UsageError, match="299 at position 299"):
        register_token_memmap(tmp_path / "train_tokens_uint32.bin", 299, "llama3", "uint32")


# --- block loader -----------------------------------------------------------------------
def test_blocks_tile_the_file_with_shifted_targets(tmp_path):
    L, B = 16, 4
    mm = ramp(tmp_path, 12 * L + 1)  # exactly 12 blocks with their +1 target token
    assert count_blocks(mm, L) == 12 and count_blocks(mm, L, with_target=False) == 12
    loader = MemmapBlockLoader(mm, L, B, seed=43)
    assert loader.batches_per_epoch == 3
    batches = take(loader, 3)
    starts = []
    for x, y, epoch in batches:
        assert x.shape == y.shape == (B, L) and x.dtype == torch.int64 and epoch == 1
        assert torch.equal(y, x + 1)  # y = block[1:], the ramp makes it x + 1
        assert torch.equal(x - x[:, :1], torch.arange(L).expand(B, L))  # contiguous
        starts += x[:, 0].tolist()
    assert sorted(starts) == [i * L for i in range(12)]  # non-overlapping, covering x of the file
    assert next(loader)[2] == 2

    x0 = take(MemmapBlockLoader(ramp(tmp_path, 10 * L + 1, "odd.bin"), L, B, seed=1), 2)  # drop_last: 2 of 10
    assert len({s for x, _, _ in x0 for s in x[:, 0].tolist()}) == 8
    loader = MemmapBlockLoader(mm, L, B, seed=1, drop_last=False, num_blocks=10)
    assert [len(x) for x, _, _ in take(loader, 3)] == [4, 4, 2]
    (blocks, epoch), = take(MemmapBlockLoader(mm, L, 2, seed=1, with_target=False), 1)
    assert blocks.shape == (2, L) and epoch == 1
    with pytest.raises(UsageError, match="fewer than one batch"):
        MemmapBlockLoader(mm, L, 13, seed=1)
    with pytest.raises(UsageError, match="num_blocks=13"):
        MemmapBlockLoader(mm, L, 4, seed=1, num_blocks=13)


class _Blocks(Dataset):
    """The reference's dataset: block i = tokens[i*L : i*L + L + 1]."""

    def __init__(self, tokens, L, n):
        self.tokens, self.L, self.n = tokens, L, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.from_numpy(np.asarray(self.tokens[i * self.L : i * self.L + self.L + 1], dtype=np.int64))


@pytest.mark.parametrize("n_blocks, B", [(12, 4), (11, 4)])
def test_order_matches_torch_dataloader_over_epochs(tmp_path, n_blocks, B):
    L = 8
    mm = ramp(tmp_path, n_blocks * L + 1)
    gen = torch.Generator()
    gen.manual_seed(44)
    dl = DataLoader(_Blocks(mm.tokens, L, n_blocks), batch_size=B, shuffle=True, generator=gen, drop_last=True)
    expected = [batch for _ in range(3) for batch in dl]  # a fresh iterator per epoch, as the reference
    ours = take(MemmapBlockLoader(mm, L, B, seed=44), len(expected))
    for want, (x, y, _) in zip(expected, ours):
        assert torch.equal(want[:, :-1], x) and torch.equal(want[:, 1:], y)


def test_shuffle_deterministic_per_seed(tmp_path):
    mm = ramp(tmp_path, 64 * 8 + 1)
    firsts = {}
    for seed in (43, 44, 45):
        a = [x[:, 0].tolist() for x, _, _ in take(MemmapBlockLoader(mm, 8, 8, seed=seed), 8)]
        b = [x[:, 0].tolist() for x, _, _ in take(MemmapBlockLoader(mm, 8, 8, seed=seed), 8)]
        assert a == b
        firsts[seed] = a
    assert firsts[43] != firsts[44] != firsts[45] != firsts[43]
    epoch1, epoch2 = firsts[43], [x[:, 0].tolist() for x, _, _ in take(MemmapBlockLoader(mm, 8, 8, seed=43), 16)][8:]
    assert epoch1 != epoch2 and sorted(sum(epoch1, [])) == sorted(sum(epoch2, []))  # reshuffled each epoch
    inorder = take(MemmapBlockLoader(mm, 8, 8, seed=43, shuffle=False), 2)
    assert inorder[1][0][:, 0].tolist() == [8 * i for i in range(8, 16)]


@pytest.mark.parametrize("k", [0, 1, 4, 7, 11, 12])
def test_resume_gives_the_same_next_batches(tmp_path, k):
    mm = ramp(tmp_path, 22 * 8 + 1)  # 22 blocks, B = 4: 5 batches per epoch, 2 blocks dropped
    ref = MemmapBlockLoader(mm, 8, 4, seed=45)
    take(ref, k)
    state = json.loads(json.dumps(ref.state_dict()))  # plain JSON: nothing to pickle
    resumed = MemmapBlockLoader(mm, 8, 4, seed=45)
    resumed.load_state_dict(state)
    for (xa, ya, ea), (xb, yb, eb) in zip(take(ref, 8), take(resumed, 8)):
        assert torch.equal(xa, xb) and torch.equal(ya, yb) and ea == eb
    other = MemmapBlockLoader(mm, 8, 2, seed=45)
    with pytest.raises(UsageError, match="batch_size=4"):
        other.load_state_dict(state)


def test_ranks_split_the_single_process_stream(tmp_path):
    mm = ramp(tmp_path, 40 * 8 + 1)
    single = [x for x, _, _ in take(MemmapBlockLoader(mm, 8, 3, seed=43), 30)]
    ranks = [[x for x, _, _ in take(MemmapBlockLoader(mm, 8, 3, seed=43, rank=r, world_size=3), 10)] for r in range(3)]
    for k in range(10):
        for r in range(3):
            assert torch.equal(ranks[r][k], single[3 * k + r])


def test_eval_batches_in_order(tmp_path):
    L, B = 8, 4
    mm = ramp(tmp_path, 30 * L + 1, "eval.bin")
    batches = list(eval_batches(mm, L, B, max_tokens=19 * L - 3))  # ceil -> 19 blocks -> 4 full batches
    assert len(batches) == 4
    starts = torch.cat([x[:, 0] for x, _ in batches]).tolist()
    assert starts == [i * L for i in range(16)]
    assert all(torch.equal(y, x + 1) for x, y in batches)
    assert len(list(eval_batches(mm, L, B))) == 7 and len(list(eval_batches(mm, L, B, max_batches=2))) == 2
    assert list(eval_batches(mm, L, B)) and [x.tolist() for x, _ in eval_batches(mm, L, B)] == \
        [x.tolist() for x, _ in eval_batches(mm, L, B)]  # a fresh pass each call


# --- T5 prefix-to-continuation ----------------------------------------------------------
def test_prefix_continuation_windows(tmp_path):
    mm = ramp(tmp_path, 20 * 64)
    loader = prefix_continuation_batches(mm, src_len=40, tgt_len=24, batch_size=3, seed=43, bos=0)
    seen = []
    for src, tgt_in, tgt in take(loader, 6):
        assert src.shape == (3, 40) and tgt_in.shape == tgt.shape == (3, 24)
        assert torch.equal(tgt[:, 0], src[:, -1] + 1) and src[:, 0].remainder(64).eq(0).all()
        assert tgt_in[:, 0].eq(0).all() and torch.equal(tgt_in[:, 1:], tgt[:, :-1])
        seen += src[:, 0].tolist()
    assert len(set(seen)) == 18 and loader.epoch == 1  # 20 windows, 6 batches of 3, drop_last
    state = loader.state_dict()
    again = prefix_continuation_batches(mm, src_len=40, tgt_len=24, batch_size=3, seed=43, bos=0)
    again.load_state_dict(state)
    for a, b in zip(take(loader, 4), take(again, 4)):
        assert all(torch.equal(u, v) for u, v in zip(a, b))
    with pytest.raises(UsageError, match="bos"):
        prefix_continuation_batches(mm, batch_size=2, seed=0, bos=1 << 20)
    evals = list(prefix_continuation_eval_batches(mm, src_len=40, tgt_len=24, batch_size=3, max_target_tokens=7 * 24))
    assert [len(s) for s, _, _ in evals] == [3, 3, 1]  # the reference keeps the last partial batch
    assert torch.cat([s[:, 0] for s, _, _ in evals]).tolist() == [64 * i for i in range(7)]


# --- RGB554 images ----------------------------------------------------------------------
def test_rgb554_formula_range_and_round_trip():
    assert RGB554_VOCAB == SOS == 16384 and IMAGE_VOCAB == 16385
    rng = np.random.default_rng(0)
    px = rng.integers(0, 256, size=(5, 7, 3), dtype=np.uint8)
    tok = rgb554_encode(px)
    assert tok.dtype == np.int64 and tok.shape == (5, 7)
    for (i, j), t in np.ndenumerate(tok):
        r, g, b = (int(v) for v in px[i, j])
        assert t == (r >> 3) * 512 + (g >> 3) * 16 + (b >> 4)
    ttok = rgb554_encode(torch.from_numpy(px))
    assert ttok.dtype == torch.int64 and np.array_equal(ttok.numpy(), tok)
    assert rgb554_encode(np.array([[0, 0, 0], [255, 255, 255], [8, 0, 0], [0, 8, 0], [0, 0, 16]], np.uint8)).tolist() \
        == [0, 16383, 512, 16, 1]
    r5, g5, b4 = np.meshgrid(np.arange(32), np.arange(32), np.arange(16), indexing="ij")
    every = np.stack([r5 << 3, g5 << 3, b4 << 4], axis=-1).astype(np.uint8).reshape(-1, 3)
    assert rgb554_encode(every).tolist() == list(range(16384))  # onto [0, 16384), in code order
    assert np.array_equal(rgb554_encode(rgb554_decode(np.arange(16384))), np.arange(16384))
    for bad in (px.astype(np.int64), px[..., :2], torch.from_numpy(px).float()):
        with pytest.raises(UsageError, match="uint8"):
            rgb554_encode(bad)


def test_sos_shift():
    x = torch.arange(12).reshape(2, 6)
    inputs, targets = sos_shift(x)
    assert inputs[:, 0].eq(SOS).all() and torch.equal(inputs[:, 1:], x[:, :-1]) and torch.equal(targets, x)


def test_image_files_loader_and_resume(tmp_path):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(37, 4, 6, 3), dtype=np.uint8)
    train, evalf = prepare_image_tokens(tmp_path / "img", images, eval_images=5, seed=3)
    assert train.num_tokens == 32 * 24 and evalf.num_tokens == 5 * 24 and train.dtype == np.dtype("<u2")
    assert train.vocab_size == RGB554_VOCAB and train.extra["tokens_per_image"] == 24 and train.extra["images"] == 32
    codes = rgb554_encode(images).reshape(37, 24)
    rows = {tuple(r) for r in codes}
    train_rows = [tuple(r) for r in train.read(0, train.num_tokens).reshape(32, 24)]
    eval_rows = [tuple(r) for r in evalf.read(0, evalf.num_tokens).reshape(5, 24)]
    assert set(train_rows) | set(eval_rows) == rows and not set(train_rows) & set(eval_rows)

    loader = ImageTokenLoader(train, batch_size=5, seed=43)
    assert loader.batches_per_epoch == 6
    got = []
    for inputs, targets, epoch in take(loader, 6):
        assert inputs.shape == targets.shape == (5, 24) and epoch == 1
        assert inputs[:, 0].eq(SOS).all() and torch.equal(inputs[:, 1:], targets[:, :-1])
        got += [tuple(r) for r in targets.tolist()]
    assert len(set(got)) == 30 and set(got) <= set(train_rows)
    assert [t.tolist() for _, t, _ in take(ImageTokenLoader(train, 5, seed=43), 6)] != \
        [t.tolist() for _, t, _ in take(ImageTokenLoader(train, 5, seed=44), 6)]

    ref = ImageTokenLoader(train, batch_size=5, seed=43)
    take(ref, 4)
    resumed = ImageTokenLoader(train, batch_size=5, seed=43)
    resumed.load_state_dict(json.loads(json.dumps(ref.state_dict())))
    for (a, b, ea), (c, d, eb) in zip(take(ref, 5), take(resumed, 5)):
        assert torch.equal(a, c) and torch.equal(b, d) and ea == eb

    ev = list(image_eval_batches(evalf, batch_size=2))
    assert len(ev) == 2 and [tuple(r) for _, t in ev for r in t.tolist()] == eval_rows[:4]
    with pytest.raises(UsageError, match="not an RGB554 image token file"):
        ImageTokenLoader(ramp(tmp_path, 100), batch_size=2)


def test_image_array_files_and_folders(tmp_path):
    rng = np.random.default_rng(2)
    images = rng.integers(0, 256, size=(6, 3, 5, 3), dtype=np.uint8)
    np.save(tmp_path / "a.npy", images)
    np.savez(tmp_path / "b.npz", images=images, labels=np.arange(6))
    assert np.array_equal(load_image_arrays(tmp_path / "a.npy"), images)
    assert np.array_equal(load_image_arrays(tmp_path / "b.npz"), images)
    np.save(tmp_path / "bad.npy", images.astype(np.float32))
    with pytest.raises(UsageError, match="bad.npy: images must be uint8"):
        load_image_arrays(tmp_path / "bad.npy")
    mm = write_image_tokens(tmp_path / "out" / "x.bin", tmp_path / "a.npy", chunk_size=4)
    assert np.array_equal(mm.read(0, mm.num_tokens), rgb554_encode(images).reshape(-1))
    train, ev = prepare_image_tokens(tmp_path / "split", tmp_path / "a.npy", eval_source=tmp_path / "b.npz")
    assert train.num_tokens == ev.num_tokens == 6 * 15 and ev.path.name == "eval.bin"
    (tokens,) = list(image_eval_batches(ev, batch_size=6, shift=False))
    assert torch.equal(tokens, torch.from_numpy(rgb554_encode(images).reshape(6, 15)))

    Image = pytest.importorskip("PIL.Image")
    folder = tmp_path / "pngs"
    (folder / "cls").mkdir(parents=True)
    for i, im in enumerate(images):
        Image.fromarray(im).save(folder / ("cls" if i % 2 else "") / f"{i:02d}.png")
    order = [0, 2, 4, 1, 3, 5]  # sorted relative paths: "00.png" .. then "cls/01.png" ..
    assert np.array_equal(load_image_folder(folder), images[order])
    mm = write_image_tokens(tmp_path / "out" / "y.bin", folder, chunk_size=4)
    assert np.array_equal(mm.read(0, mm.num_tokens), rgb554_encode(images[order]).reshape(-1))
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(folder / "zz.png")
    with pytest.raises(UsageError, match="zz.png is 4x4"):
        load_image_folder(folder)
