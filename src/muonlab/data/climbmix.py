"""The `climbmix` corpus: upstream's pre-shuffled ClimbMix parquet shards.

URL scheme `{base_url}/shard_{i:05d}.parquet`. Shards 0..num_shards-1 are the training
split; the last shard, 06542, is pinned for evaluation: val is the beginning of its
packed row stream and holdout the next equally long stretch of that same stream.

Downloads run in a thread pool, retry with exponential backoff, stream into a `.tmp`
file beside the target, check that it is a readable parquet file with a `text`
column, and only then rename it to its final name: a file under a final name is
always complete. Shards already present are skipped.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import requests

from muonlab.atomic import create_temp_beside
from muonlab.data.config import CLIMBMIX_MAX_SHARD
from muonlab.errors import MuonlabError

VAL_SHARD = CLIMBMIX_MAX_SHARD


def shard_name(index: int) -> str:
    return f"shard_{index:05d}.parquet"


def train_shard_ids(num_shards: int) -> list[int]:
    n = CLIMBMIX_MAX_SHARD if num_shards == -1 else min(num_shards, CLIMBMIX_MAX_SHARD)
    return list(range(n))


class _BadShard(Exception):
    """The bytes arrived but are not a usable shard (may be a transfer glitch: retried)."""


def check_shard(path: Path) -> int:
    """Read the whole `text` column of a shard; return its row count or raise _BadShard."""
    try:
        pf = pq.ParquetFile(path)
        if "text" not in pf.schema_arrow.names:
            raise _BadShard("no 'text' column")
        rows = 0
        for g in range(pf.metadata.num_row_groups):
            rows += pf.read_row_group(g, columns=["text"]).num_rows
        return rows
    except (pa.ArrowException, OSError) as e:
        raise _BadShard(f"not a readable parquet file ({e})") from None


@dataclass
class Downloader:
    base_url: str
    dest: Path
    retries: int = 5
    backoff_s: float = 2.0
    timeout_s: float = 30.0
    log: Callable[[str], None] = print

    def fetch(self, index: int) -> Path:
        """Download one shard unless present; MuonlabError after the last failed attempt."""
        name = shard_name(index)
        final = self.dest / name
        if final.exists():
            return final
        url = f"{self.base_url.rstrip('/')}/{name}"
        last = ""
        for attempt in range(1, self.retries + 1):
            try:
                self._download_to(url, final)
                self.log(f"data: downloaded {name}")
                return final
            except (requests.RequestException, OSError, _BadShard) as e:
                last = f"{type(e).__name__}: {e}" if not isinstance(e, _BadShard) else str(e)
                self.log(f"data: attempt {attempt}/{self.retries} for {name} failed: {last}")
                if attempt < self.retries:
                    time.sleep(self.backoff_s * 2 ** (attempt - 1))
        raise MuonlabError(f"could not download {name} from {url} after {self.retries} attempts: {last}")

    def _download_to(self, url: str, final: Path) -> None:
        self.dest.mkdir(parents=True, exist_ok=True)
        # A unique temp name, so concurrent preparers never write the same .tmp file.
        fd, tmp_name = create_temp_beside(final)
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as f, requests.get(url, stream=True, timeout=self.timeout_s) as r:
                r.raise_for_status()
                expected = r.headers.get("Content-Length")
                received = 0
                for chunk in r.iter_content(chunk_size=1 << 20):
                    f.write(chunk)
                    received += len(chunk)
                if expected is not None and received != int(expected):
                    raise requests.exceptions.ContentDecodingError(
                        f"connection closed after {received} of {expected} bytes"
                    )
                f.flush()
                os.fsync(f.fileno())
            check_shard(tmp)
            os.replace(tmp, final)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def fetch_all(self, indices: list[int], workers: int) -> list[Path]:
        missing = [i for i in indices if not (self.dest / shard_name(i)).exists()]
        if not missing:
            return [self.dest / shard_name(i) for i in indices]
        self.log(f"data: downloading {len(missing)} of {len(indices)} shards into {self.dest}")
        errors: list[str] = []
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(missing)))) as pool:
            for index, future in zip(missing, [pool.submit(self.fetch, i) for i in missing]):
                try:
                    future.result()
                except MuonlabError as e:
                    errors.append(str(e))
        if errors:
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            raise MuonlabError(errors[0] + more)
        return [self.dest / shard_name(i) for i in indices]
