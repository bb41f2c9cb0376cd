"""Seed 004's datasets and tokenizers, obtained only where the user asks: `muonlab prepare --preset P
--download` fetches a paper preset's files from the Hugging Face hub, checks them, and prepares its
token files from them; `train` then reads them with the settings `prepare` prints.

  preset                             dataset (App. J)                             tokenizer
  nanogpt-124m, nanogpt-124m-moe     FineWeb sample-10BT                          GPT-2's BPE (openai-community/gpt2)
  smollm2-135m, reuse-k9, t5-small   FineWeb sample-10BT                          SmolLM2's (HuggingFaceTB/SmolLM2-135M)
  t5gemma2                           FineWeb sample-10BT                          the Gemma tokenizer of the model
                                                                                  (google/t5gemma-2-270m-270m, 262k ids;
                                                                                  gated: accept its licence, HF_TOKEN)
  qwen2.5-0.5b                       FineWeb sample-10BT (the subset J.3 names)   Qwen2.5's (Qwen/Qwen2.5-0.5B)
  llama-3.2-1b                       FineWeb sample-10BT                          Llama-3.2's (meta-llama/Llama-3.2-1B,
                                                                                  gated: accept its licence, HF_TOKEN)
  imagegpt                           benjamin-paine/imagenet-1k-32x32 (parquet)   none (RGB554 colour codes)
  protein-llama                      your UniRef50 2021_04 FASTA (--path)         ProtGPT2's (nferruz/ProtGPT2)

Choices where the paper is silent: FineWeb's subset is named only for Qwen (sample-10BT) and is used for
every text preset; `--download-files K` takes its first K shards in name order (default: all 15, about
32 GB). UniRef50 2021_04 is a past UniProt release that the hub does not hold as FASTA, so the protein
preset downloads the tokenizer and reads the FASTA (`.fasta.gz` as published) the user gives.

Each file is downloaded with huggingface_hub (resumed where it stopped, HF_TOKEN sent, a progress bar)
into a staging folder, its SHA-256 (LFS) or git blob id compared with the hub's, and only then moved to
its final name; `SHA256SUMS.json` records what was checked. When every file of an asset is present
with the recorded size, nothing is fetched (HF_HUB_OFFLINE=1 or no network is fine).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from muonlab.atomic import write_json
from muonlab.errors import MuonlabError, UsageError

MANIFEST = "SHA256SUMS.json"
STAGING = ".partial"


@dataclass(frozen=True)
class HubAsset:
    """Files of one hub repository: those matching `patterns` (fnmatch), the first `max_files` by name."""

    repo_id: str
    repo_type: str  # "dataset" | "model"
    patterns: tuple[str, ...]
    revision: str = "main"
    what: str = ""

    def folder(self, root: Path) -> Path:
        return root / "hub" / f"{self.repo_type}s--{self.repo_id.replace('/', '--')}"


FINEWEB = HubAsset("HuggingFaceFW/fineweb", "dataset", ("sample/10BT/*.parquet",), what="FineWeb sample-10BT")
IMAGENET32 = HubAsset("benjamin-paine/imagenet-1k-32x32", "dataset", ("data/train-*.parquet",
                                                                      "data/validation-*.parquet"),
                      what="ImageNet 32x32 (parquet)")


def _tokenizer(repo_id: str) -> HubAsset:
    return HubAsset(repo_id, "model", ("tokenizer.json",), what=f"{repo_id}'s tokenizer")


@dataclass(frozen=True)
class PaperData:
    """What a paper preset trains on, and the data settings that read it once downloaded."""

    dataset: HubAsset | None
    tokenizer: HubAsset | None

    def settings(self, root: Path) -> dict:
        out: dict = {}
        if self.dataset is FINEWEB:
            out.update({"data.source": "local", "data.path": str(FINEWEB.folder(root) / "sample" / "10BT")})
        elif self.dataset is IMAGENET32:
            data = IMAGENET32.folder(root) / "data"
            out.update({"data.source": "images", "data.path": str(data / "train-*.parquet"),
                        "data.eval_path": str(data / "validation-*.parquet")})
        if self.tokenizer is not None:
            out["data.tokenizer_json"] = str(self.tokenizer.folder(root) / "tokenizer.json")
        return out


GPT2 = _tokenizer("openai-community/gpt2")
SMOLLM2 = _tokenizer("HuggingFaceTB/SmolLM2-135M")
PAPER_DATA = {
    "nanogpt-124m": PaperData(FINEWEB, GPT2),
    "nanogpt-124m-moe": PaperData(FINEWEB, GPT2),
    "t5-small": PaperData(FINEWEB, SMOLLM2),  # App. J.5: V = 49,152, the SmolLM2 tokenizer
    "smollm2-135m": PaperData(FINEWEB, SMOLLM2),
    # App. J.5 / Table 16: the random-init google/t5gemma-2-270m-270m with its shared 262k-row table, so its own
    # (Gemma) tokenizer; the paper names no other
    "t5gemma2": PaperData(FINEWEB, _tokenizer("google/t5gemma-2-270m-270m")),
    "reuse-k9": PaperData(FINEWEB, SMOLLM2),
    "qwen2.5-0.5b": PaperData(FINEWEB, _tokenizer("Qwen/Qwen2.5-0.5B")),
    "llama-3.2-1b": PaperData(FINEWEB, _tokenizer("meta-llama/Llama-3.2-1B")),
    "imagegpt": PaperData(IMAGENET32, None),
    "protein-llama": PaperData(None, _tokenizer("nferruz/ProtGPT2")),
}


def paper_data(preset: str) -> PaperData:
    if preset not in PAPER_DATA:
        raise UsageError(f"--download obtains the data of seed 004's presets ({', '.join(PAPER_DATA)}), "
                         f"not of {preset}")
    return PAPER_DATA[preset]


# --- checks ------------------------------------------------------------------------------------
def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def git_blob_id(path: Path) -> str:
    """git's object id of a file (what the hub reports for a file outside LFS)."""
    h = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())  # noqa: S324 (git's id, not a security check)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    if not path.is_file():
        return {"files": {}, "complete": False, "max_files": None}
    try:
        record = json.loads(path.read_text())
        if not isinstance(record["files"], dict):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        raise MuonlabError(f"{path} is not a muonlab download record; delete it to download again") from None
    return record


def present(asset: HubAsset, root: Path, max_files: int | None = None) -> list[str] | None:
    """The asset's checked files when a finished download covers `max_files` (None: all) and every file
    is on disk with its checked size; else None."""
    folder = asset.folder(root)
    record = _manifest(folder)
    files, had = record["files"], record.get("max_files")
    if not files or not record.get("complete") or (had is not None and (max_files is None or max_files > had)):
        return None
    for name, entry in files.items():
        path = folder / name
        if not path.is_file():
            return None
        if path.stat().st_size != entry["size"]:
            raise MuonlabError(f"{path} has {path.stat().st_size} bytes, {entry['size']} when it was checked; "
                               f"delete it and run `muonlab prepare --download` again")
    return sorted(files)


# --- the download ------------------------------------------------------------------------------
def _remote_files(asset: HubAsset, max_files: int | None) -> list:
    from huggingface_hub import HfApi  # noqa: PLC0415

    tree = HfApi().list_repo_tree(asset.repo_id, repo_type=asset.repo_type, revision=asset.revision,
                                  recursive=True, expand=True)
    files = sorted((f for f in tree if hasattr(f, "size") and any(fnmatch.fnmatch(f.path, p) for p in asset.patterns)),
                   key=lambda f: f.path)
    if not files:
        raise MuonlabError(f"{asset.repo_id} has no file matching {', '.join(asset.patterns)} at {asset.revision}")
    if max_files is not None:
        kept = []
        for pattern in asset.patterns:  # the first K of each pattern (train and validation shards alike)
            kept += [f for f in files if fnmatch.fnmatch(f.path, pattern)][:max_files]
        files = sorted(set(kept), key=lambda f: f.path)
    return files


def _check(path: Path, remote) -> str:
    digest = sha256_of(path)
    lfs = getattr(remote, "lfs", None)
    expected = getattr(lfs, "sha256", None) if lfs is not None else None
    if expected is not None and digest != expected:
        raise MuonlabError(f"{remote.path}: SHA-256 {digest[:12]}... is not the hub's {expected[:12]}...")
    if expected is None and getattr(remote, "blob_id", None) and git_blob_id(path) != remote.blob_id:
        raise MuonlabError(f"{remote.path}: its git blob id is not the hub's {remote.blob_id[:12]}...")
    if path.stat().st_size != remote.size:
        raise MuonlabError(f"{remote.path}: {path.stat().st_size} bytes, the hub lists {remote.size}")
    return digest


def fetch(asset: HubAsset, root: Path, max_files: int | None = None, log: Callable[[str], None] = print) -> list[str]:
    """The asset's files under `asset.folder(root)`, downloaded and checked unless already there."""
    have = present(asset, root, max_files)
    if have is not None:
        log(f"data: {asset.what or asset.repo_id}: {len(have)} file(s) already checked in {asset.folder(root)}")
        return have
    from huggingface_hub import constants, hf_hub_download  # noqa: PLC0415

    from muonlab.data.climbmix import _cause, _hub_errors  # noqa: PLC0415

    folder = asset.folder(root)
    if constants.HF_HUB_OFFLINE:
        raise MuonlabError(f"{asset.repo_id} is not downloaded into {folder} and HF_HUB_OFFLINE is set: unset it "
                           f"to download")
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)  # its retry warnings: the error is one line
    try:
        remote = _remote_files(asset, max_files)
    except _hub_errors() as e:
        raise MuonlabError(f"could not list {asset.repo_id} on the hub: {_cause(e)}") from None
    record = _manifest(folder)["files"]
    log(f"data: {asset.what or asset.repo_id}: {len(remote)} file(s) into {folder}")

    def save(complete: bool) -> None:
        write_json(folder / MANIFEST, {"repo_id": asset.repo_id, "revision": asset.revision, "complete": complete,
                                       "max_files": max_files, "files": record})

    for f in remote:
        final = folder / f.path
        if f.path in record and final.is_file() and final.stat().st_size == record[f.path]["size"]:
            continue
        try:
            got = Path(hf_hub_download(asset.repo_id, f.path, repo_type=asset.repo_type, revision=asset.revision,
                                       local_dir=folder / STAGING))
        except _hub_errors() as e:
            raise MuonlabError(f"could not download {f.path} from {asset.repo_id}: {_cause(e)}") from None
        try:
            digest = _check(got, f)
        except MuonlabError:
            got.unlink(missing_ok=True)  # a bad transfer is downloaded again next time
            raise
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(got, final)
        record[f.path] = {"sha256": digest, "size": f.size}
        save(complete=False)
        log(f"data: checked {f.path}")
    save(complete=True)
    return sorted(record)
