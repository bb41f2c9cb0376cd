"""`muonlab prepare`: download or materialise a corpus and train its tokenizer (--download: seed 004's
datasets from the Hugging Face hub)."""

from __future__ import annotations

import shlex

from muonlab.cli.config_flags import collect_overrides
from muonlab.cli.parser import _emit, _log_for
from muonlab.cli.resolve import _resolve_config
from muonlab.errors import UsageError
from muonlab.settings import integer_at_least

HELP = "download/materialise a corpus and train its tokenizer"


def add_arguments(p, context) -> None:
    context.with_config(p, data_only=True)
    p.add_argument("--download", action="store_true",
                   help="seed 004's presets: fetch the paper's dataset and tokenizer from the Hugging Face hub "
                        "(checked, resumable; nothing is fetched when they are here) and prepare them")
    p.add_argument("--download-files", type=integer_at_least(1), default=None, metavar="K",
                   help="with --download: only the first K shards of each split (default: all)")


def run(args) -> int:
    from muonlab.families import get_family

    if args.download_files is not None and not args.download:
        raise UsageError("--download-files counts the shards --download fetches; give --download")
    cfg = _resolve_config(args)
    train_with = None
    if args.download:
        cfg, train_with = _downloaded(args, cfg)
    data = get_family(cfg.family).prepare_data(cfg, log=_log_for(args))
    payload = data.describe()
    if train_with:
        payload["train_with"] = train_with
    text = "\n".join(f"{k}: {v}" for k, v in payload.items())
    _emit(args, payload, text)
    return 0


def _downloaded(args, cfg):
    """`prepare --download`: fetch the paper preset's dataset and tokenizer; the config that reads them."""
    from muonlab.config import apply_overrides, canonical_overrides
    from muonlab.data.paper_data import fetch, paper_data
    from muonlab.lab.request import DEFAULT_PRESET
    from muonlab.paths import cache_root

    wanted = paper_data(args.preset or DEFAULT_PRESET)
    user = canonical_overrides(collect_overrides(args))
    if wanted.dataset is None and "data.path" not in user:
        raise UsageError(f"{args.preset} trains on UniRef50 2021_04, which the hub does not hold as FASTA: give "
                         f"--path, the release's uniref50.fasta.gz (--download fetches the tokenizer)")
    root = cache_root(cfg.data.cache_dir)
    log = _log_for(args)
    for asset, max_files in ((wanted.dataset, args.download_files), (wanted.tokenizer, None)):
        if asset is not None:
            fetch(asset, root, max_files, log)
    settings = {k: v for k, v in wanted.settings(root).items() if k not in user}
    cfg = apply_overrides(cfg, settings, origin="download")
    flags = " ".join(f"--{k.split('.')[-1].replace('_', '-')} {shlex.quote(str(v))}" for k, v in settings.items())
    return cfg, f"muonlab train --preset {args.preset} {flags}"
