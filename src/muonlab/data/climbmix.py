"""The `climbmix` corpus: upstream's pre-shuffled ClimbMix parquet shards.

The shards `shard_{i:05d}.parquet` of the Hugging Face dataset that `base_url` names
(`{endpoint}/datasets/{owner}/{name}/resolve/{revision}`). Shards 0..num_shards-1 are the
training split; the last shard, 06542, is pinned for evaluation: val is the beginning of its
packed row stream and holdout the next equally long stretch of that same stream.

Downloads go through huggingface_hub, in a thread pool: a partial file is resumed where it
stopped, a token in HF_TOKEN (or `huggingface-cli login`) is sent, HF_HUB_OFFLINE=1 uses only
what is already here, and a progress bar shows the bytes on a terminal. Each shard lands in a
staging folder (`.partial/`), is checked to be a readable parquet file with a `text` column,
and only then takes its final name: a file under a final name is always complete. Shards
already present are skipped; a failed shard is tried again with exponential backoff.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from muonlab.data.config import CLIMBMIX_MAX_SHARD, hub_location
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


STAGING = ".partial"  # huggingface_hub's downloads (and their resumable parts) before the check


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
        from huggingface_hub import constants  # noqa: PLC0415 (imported when a download is due)

        name = shard_name(index)
        final = self.dest / name
        if final.exists():
            return final
        last = ""
        for attempt in range(1, self.retries + 1):
            try:
                self._download_to(name, final)
                self.log(f"data: downloaded {name}")
                return final
            except (OSError, _BadShard, *_hub_errors()) as e:
                if constants.HF_HUB_OFFLINE:
                    raise MuonlabError(f"{name} is not downloaded and HF_HUB_OFFLINE is set: unset it to "
                                       f"download from {self.base_url}") from None
                last = str(e) if isinstance(e, _BadShard) else _cause(e)
                self.log(f"data: attempt {attempt}/{self.retries} for {name} failed: {last.splitlines()[0]}")
                if attempt < self.retries:
                    time.sleep(self.backoff_s * 2 ** (attempt - 1))
        raise MuonlabError(f"could not download {name} from {self.base_url} after {self.retries} attempts: "
                           f"{last.splitlines()[0]}")

    def _download_to(self, name: str, final: Path) -> None:
        from huggingface_hub import constants, hf_hub_download  # noqa: PLC0415

        endpoint, repo, revision = hub_location(self.base_url)  # checked by DataConfig.validate
        staging = self.dest / STAGING
        constants.HF_HUB_DOWNLOAD_TIMEOUT = self.timeout_s  # read per request: a stalled body is retried
        path = Path(hf_hub_download(repo, name, repo_type="dataset", revision=revision, endpoint=endpoint,
                                    local_dir=staging, etag_timeout=self.timeout_s))
        try:
            check_shard(path)
        except _BadShard:
            path.unlink(missing_ok=True)  # and its record, so the next attempt downloads it again
            for record in (staging / ".cache" / "huggingface" / "download").glob(f"{name}.*"):
                record.unlink(missing_ok=True)
            raise
        os.replace(path, final)


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


def _hub_errors() -> tuple[type[BaseException], ...]:
    """huggingface_hub's and its HTTP client's errors (an HTTP status, a dropped connection)."""
    import httpx2  # noqa: PLC0415
    from huggingface_hub import errors  # noqa: PLC0415

    return (errors.HfHubHTTPError, errors.LocalEntryNotFoundError, httpx2.HTTPError)


def _cause(exc: BaseException) -> str:
    """The first line of the innermost error (huggingface_hub wraps an HTTP status in a lookup error)."""
    while exc.__cause__ is not None or (exc.__context__ is not None and not exc.__suppress_context__):
        exc = exc.__cause__ or exc.__context__
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
