"""ClimbMix download over loopback HTTP: arrival, atomicity, reuse, corruption, retries."""

import hashlib
import threading
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from muonlab.data import DataConfig, prepare_data
from muonlab.data.synthetic import MarkovText
from muonlab.errors import MuonlabError, UsageError

pytestmark = pytest.mark.network

SHARDS = {"shard_00000.parquet": (0, 300), "shard_00001.parquet": (1, 300), "shard_06542.parquet": (2, 500)}


def shard_texts(seed: int, n: int) -> list[str]:
    chain = MarkovText.random(200, 4, seed=0)
    rng = np.random.default_rng(seed)
    words = chain.sample(n, 120, rng)
    lengths = rng.integers(5, 120, size=n)  # documents of varied length
    return [chain.render(row[:k]) for row, k in zip(words, lengths)]


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("served")
    for name, (seed, n) in SHARDS.items():
        pq.write_table(pa.table({"text": shard_texts(seed, n), "id": list(range(n))}), root / name, row_group_size=200)
    return root


class ShardHandler(BaseHTTPRequestHandler):
    """Serves files from `root` as the Hugging Face Hub does (HEAD with an ETag, GET honouring a
    Range); `modes[name]` can be 'garbage', '500' or 'drop' (the first GET closes mid-body)."""

    def __init__(self, *args, root: Path, modes: dict, hits: list, **kwargs):
        self.root, self.modes, self.hits = root, modes, hits
        super().__init__(*args, **kwargs)

    def log_message(self, *args):  # keep test output quiet
        pass

    def _body(self, name: str) -> bytes | None:
        path = self.root / name
        if not path.exists():
            return None
        return b"PAR1 this is not a parquet file" * 100 if self.modes.get(name) == "garbage" else path.read_bytes()

    def _head(self, name: str, data: bytes, status: int = 200, length: int | None = None) -> None:
        self.send_response(status)
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("X-Repo-Commit", "0" * 40)
        self.send_header("Content-Length", str(len(data) if length is None else length))
        self.end_headers()

    def do_HEAD(self):
        name = self.path.rsplit("/", 1)[-1]
        data = self._body(name)
        if self.modes.get(name) == "500":
            self.send_error(500, "boom")
        elif data is None:
            self.send_error(404)
        else:
            self._head(name, data)

    def do_GET(self):
        name = self.path.rsplit("/", 1)[-1]
        self.hits.append(name)
        if self.modes.get(name) == "500":
            self.send_error(500, "boom")
            return
        data = self._body(name)
        if data is None:
            self.send_error(404)
            return
        start = int(self.headers["Range"].split("=")[1].split("-")[0]) if self.headers.get("Range") else 0
        part = data[start:]
        self._head(name, data, 206 if start else 200, len(part))
        if self.modes.get(name) == "drop":  # once: the next request resumes where this one stopped
            del self.modes[name]
            self.wfile.write(part[: len(part) // 2])
            self.close_connection = True
            return
        self.wfile.write(part)


@pytest.fixture
def server(shard_dir):
    modes: dict = {}
    hits: list = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(ShardHandler, root=shard_dir, modes=modes, hits=hits))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/datasets/karpathy/climbmix-400b-shuffle/resolve/main"
    yield {"url": url, "modes": modes, "hits": hits}
    httpd.shutdown()
    httpd.server_close()
    thread.join()


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("MUONLAB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def config(server, **kw) -> DataConfig:
    base = dict(
        source="climbmix", base_url=server["url"], num_shards=2, vocab_size=300, download_workers=3,
        download_retries=2, download_backoff_s=0.0, download_timeout_s=5.0,
    )
    return DataConfig(**{**base, **kw})


def download_dir(cache: Path) -> Path:
    (d,) = (cache / "downloads").iterdir()
    return d


def shards_in(d: Path) -> list[str]:
    """The files under their final names (huggingface_hub's staging folder `.partial` aside)."""
    return sorted(p.name for p in d.iterdir() if p.name != ".partial")


def test_download_validate_and_reuse(server, cache, shard_dir):
    logs: list[str] = []
    data = prepare_data(config(server), log=logs.append)
    d = download_dir(cache)
    assert shards_in(d) == sorted(SHARDS)
    assert not [p for p in (d / ".partial").glob("*.parquet")]  # each moved out once checked
    for name in SHARDS:
        assert (d / name).read_bytes() == (shard_dir / name).read_bytes()
    assert sorted(server["hits"]) == sorted(SHARDS)
    assert data.manifest["splits"]["train"]["docs"] == 600
    assert data.tokenizer.vocab_size == 300 and data.tokenizer.training["split"] == "train"

    first_batches = list(zip(range(3), data.documents("train")))
    assert first_batches[0][1].docs == shard_texts(0, 300)[:128]
    # As upstream, batches do not straddle row groups (200 rows here): 128, 72, then 100.
    assert first_batches[1][1].docs == shard_texts(0, 300)[128:200]
    assert first_batches[2][1].docs == shard_texts(0, 300)[200:300]
    val_docs = [doc for batch in data.documents("val") for doc in batch.docs]
    assert val_docs == shard_texts(2, 500)
    with pytest.raises(UsageError, match="use eval_rows"):
        data.documents("holdout")

    logs.clear()
    again = prepare_data(config(server), log=logs.append)
    assert sorted(server["hits"]) == sorted(SHARDS)  # no new requests
    assert any("reusing climbmix" in line for line in logs) and any("reusing tokenizer" in line for line in logs)
    assert (again.corpus_hash, again.tokenizer_hash) == (data.corpus_hash, data.tokenizer_hash)


def test_holdout_is_the_next_window_of_the_val_stream(server, cache):
    data = prepare_data(config(server), log=lambda s: None)
    T, n = 32, 5  # a window of n rows

    def rows(split, n_rows, B):
        batches = data.eval_rows(split, B=B, T=T, max_tokens=n_rows * T)
        return torch.cat([torch.cat([x, y[:, -1:]], dim=1) for x, y in batches]).tolist()

    both = rows("val", 2 * n, B=4)
    assert len(both) == 2 * n
    assert rows("val", n, B=2) == both[:n]
    assert rows("holdout", n, B=3) == both[n:]


def test_corrupted_shard_names_the_file_and_leaves_nothing(server, cache):
    server["modes"]["shard_00001.parquet"] = "garbage"
    with pytest.raises(MuonlabError, match=r"shard_00001\.parquet.*not a readable parquet"):
        prepare_data(config(server), log=lambda s: None)
    d = download_dir(cache)
    assert shards_in(d) == ["shard_00000.parquet", "shard_06542.parquet"]
    assert server["hits"].count("shard_00001.parquet") == 2  # retried, then gave up
    assert not (d / ".partial" / "shard_00001.parquet").exists()


def test_server_errors_exhaust_retries(server, cache, monkeypatch):
    import huggingface_hub.utils._http as hub_http

    monkeypatch.setattr(hub_http.time, "sleep", lambda s: None)  # the hub's own backoff between its retries
    server["modes"]["shard_06542.parquet"] = "500"
    with pytest.raises(MuonlabError, match="500") as info:
        prepare_data(config(server, download_retries=3), log=lambda s: None)
    assert "shard_06542.parquet" in str(info.value) and "after 3 attempts" in str(info.value)
    d = download_dir(cache)
    assert not (d / "shard_06542.parquet").exists()

    # Once the server recovers, only the missing shard is fetched.
    server["modes"].clear()
    before = len(server["hits"])
    prepare_data(config(server), log=lambda s: None)
    assert server["hits"][before:] == ["shard_06542.parquet"]


def test_a_dropped_download_resumes_where_it_stopped(server, cache, shard_dir):
    server["modes"]["shard_06542.parquet"] = "drop"
    prepare_data(config(server), log=lambda s: None)
    d = download_dir(cache)
    assert (d / "shard_06542.parquet").read_bytes() == (shard_dir / "shard_06542.parquet").read_bytes()
    assert server["hits"].count("shard_06542.parquet") == 2  # the second request asked for the rest only


def test_offline_mode_uses_what_is_here_and_says_what_is_missing(server, cache, monkeypatch):
    from huggingface_hub import constants

    prepare_data(config(server, num_shards=1), log=lambda s: None)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    hits = len(server["hits"])
    prepare_data(config(server, num_shards=1), log=lambda s: None)  # all here: no request at all
    with pytest.raises(MuonlabError, match="shard_00001.parquet is not downloaded and HF_HUB_OFFLINE is set"):
        prepare_data(config(server, num_shards=2), log=lambda s: None)
    assert len(server["hits"]) == hits


def test_a_token_in_hf_token_is_sent(server, cache, monkeypatch):
    from huggingface_hub import constants

    seen = []
    real = ShardHandler.do_GET

    def spy(self):
        seen.append(self.headers.get("Authorization"))
        real(self)

    monkeypatch.setattr(ShardHandler, "do_GET", spy)
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(cache / "no-token-file"))
    prepare_data(config(server, num_shards=1), log=lambda s: None)
    assert seen and set(seen) == {"Bearer hf_test_token"}


def test_a_base_url_that_is_no_hub_dataset_is_refused():
    with pytest.raises(UsageError, match="must name a Hugging Face dataset"):
        DataConfig(source="climbmix", base_url="http://example.org/shards").validate()
