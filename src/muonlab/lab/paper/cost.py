"""What a table costs before a lab launches it (`muonlab paper run TABLE --preset P --dry-run`): each
missing run's FLOPs and the GPU-hours they take at a stated model-FLOPs utilisation.

FLOPs of a run = the model's training FLOPs per token (its `estimate_flops()`, upstream's 6N plus
attention, the number the runs' MFU is computed from) times the tokens it trains (steps x batch), plus
its evaluations at a third of that per token (a forward pass) times the evaluated tokens (each periodic
evaluation of val, and the final val and holdout). GPU-hours = FLOPs / (peak x MFU) / 3600, peak being the
GPU's dense bf16 FLOP/s (`muonlab.device`'s table). A run that checkpoints its blocks (seed 003's gates)
computes each block's forward twice: its training FLOPs are 8N instead of 6N a token, 4/3 of the count.
A run with a time budget instead of a step count costs its budget: FLOPs = peak x MFU x budget. Data
preparation, compilation and checkpoints are not counted. The models are built on the meta device:
nothing is allocated.

The MFU is the last one measured in the ledger for the preset on that GPU where there is one (a run's
`mfu_percent`, its device named in its provenance), else 40%, and the output says which.
"""

from __future__ import annotations

from typing import Any

from muonlab.errors import UsageError


def default_vocab(cfg) -> int:
    """The table the config trains: its BPE size where it trains one, else the paper's (or the CPU data's)
    vocabulary of the setting (the model's own table needs the data's tokenizer otherwise)."""
    from muonlab.families.tied.hf.model import HF_MODELS  # noqa: PLC0415
    from muonlab.families.tied.t5.t5gemma2 import PAPER_VOCAB  # noqa: PLC0415

    if cfg.family == "imagegpt":
        return 16_384  # RGB554 colours
    if cfg.family == "t5" and str(cfg.model.preset).startswith("t5gemma2") and cfg.data.source == "memmap":
        return PAPER_VOCAB
    if cfg.family == "reuse" and cfg.data.source == "memmap":
        return 49_152
    if cfg.data.source == "synthetic_protein":
        return 25  # one token per residue
    if cfg.family == "hf" and cfg.data.source in ("memmap", "fasta"):
        return HF_MODELS[cfg.model.preset][1]["vocab_size"]
    return cfg.data.vocab_size


def flops_per_token(cfg) -> float:
    import torch  # noqa: PLC0415

    from muonlab.device import Runtime  # noqa: PLC0415
    from muonlab.train.build import build_model  # noqa: PLC0415

    model = build_model(cfg, default_vocab(cfg), Runtime(torch.device("meta"), "fp32"))
    return float(model.estimate_flops())


def gpu_peak(gpu: str) -> float:
    from muonlab.device import peak_flops_of  # noqa: PLC0415

    peak = peak_flops_of(gpu)
    if peak is None:
        raise UsageError(f"--gpu {gpu!r} is not a GPU whose peak is known (H100, H200, B200, A100, L40S, ...)")
    return peak


ASSUMED_MFU = 0.4


def measured_mfu(records: list[dict], preset: str, gpu: str) -> tuple[float, str]:
    """(MFU, where it comes from): the latest ok run's of `preset` on a `gpu` (its name's words in the device's:
    H100 and H200 share a peak, not a memory system), else ASSUMED_MFU."""
    from muonlab.config import preset_of  # noqa: PLC0415

    gpu_peak(gpu)  # a GPU whose peak is known

    def words(name: str) -> set[str]:
        return set(name.upper().replace("-", " ").replace("_", " ").split())

    for rec in reversed(records):
        mfu = (rec.get("metrics") or {}).get("mfu_percent")
        name = (rec.get("provenance") or {}).get("device_name") or ""
        if (rec.get("status") == "ok" and isinstance(mfu, (int, float)) and mfu > 0 and isinstance(rec.get("config"), dict)
                and words(gpu) <= words(name) and preset_of(rec["config"]) == preset):
            return mfu / 100, f"measured: run {rec.get('run_id')} on {name}"
    return ASSUMED_MFU, f"assumed: no run of preset {preset} on a {gpu} in the ledger"


def recompute_factor(cfg) -> float:
    """4/3 where every block's forward runs again in the backward (activation checkpointing), else 1."""
    memory = getattr(cfg.model, "memory", None)
    return 4 / 3 if memory is not None and getattr(memory, "checkpoint_blocks", False) else 1.0


def run_cost(cfg, peak: float, mfu: float) -> dict[str, Any]:
    """{flops, gpu_hours, tokens} of one run of `cfg` at `mfu` of `peak` FLOP/s."""
    t = cfg.train
    if t.num_steps is None:
        seconds = float(t.time_budget)
        return {"tokens": None, "flops": peak * mfu * seconds, "gpu_hours": seconds / 3600,
                "basis": f"time budget {seconds:.0f} s"}
    per_token = flops_per_token(cfg)
    tokens = t.num_steps * t.total_batch_size
    periodic = t.num_steps // t.eval_every if t.eval_every else 0
    evaluated = t.eval_tokens * (periodic + 2)  # each periodic val evaluation, then the final val and holdout
    recompute = recompute_factor(cfg)
    flops = per_token * recompute * tokens + per_token / 3 * evaluated
    return {"tokens": tokens, "flops": flops, "gpu_hours": flops / (peak * mfu) / 3600,
            "basis": f"{per_token:.4g} FLOPs/token x {tokens:,} tokens" + (" x 4/3 (recompute)" if recompute != 1 else "")
                     + " + evaluation"}


def price(plan: list[dict[str, Any]], configs: dict[tuple, Any], gpu: str, mfu: float,
          mfu_basis: str = "given") -> dict[str, Any]:
    """The plan's runs to do, each with its cost, and the totals."""
    if not 0 < mfu <= 1:
        raise UsageError(f"--mfu must be in (0, 1], got {mfu}")
    peak = gpu_peak(gpu)
    cache: dict[str, dict] = {}
    rows = []
    for p in plan:
        if not (p["action"] == "run" or p["action"].startswith("resume")):
            continue
        cfg = configs[(p["arm"], p["seed"], p["config_hash"])]
        shape = cfg.config_hash()  # runs of one config differ only in their seed: one model to build
        key = f"{p['arm']}:{shape}"
        if key not in cache:
            cache[key] = run_cost(cfg, peak, mfu)
        rows.append({**p, **cache[key]})
    return {"gpu": gpu, "peak_flops": peak, "mfu": mfu, "mfu_basis": mfu_basis, "runs": rows,
            "total_flops": sum(r["flops"] for r in rows), "total_gpu_hours": sum(r["gpu_hours"] for r in rows)}


def format_price(priced: dict[str, Any], done: int) -> str:
    lines = [f"{'arm':<24} {'seed':>5}  {'tokens':>15}  {'FLOPs':>10}  {'GPU-hours':>9}  action"]
    for r in priced["runs"]:
        tokens = "-" if r["tokens"] is None else f"{r['tokens']:,}"
        lines.append(f"{r['arm']:<24} {r['seed']:>5}  {tokens:>15}  {r['flops']:>10.3e}  {r['gpu_hours']:>9.2f}  "
                     f"{r['action']}")
    lines.append(f"\n{len(priced['runs'])} run(s) to do ({done} already done): {priced['total_flops']:.3e} FLOPs, "
                 f"{priced['total_gpu_hours']:.1f} GPU-hours at {100 * priced['mfu']:.1f}% MFU "
                 f"({priced.get('mfu_basis', 'given')}) of a {priced['gpu']} "
                 f"({priced['peak_flops'] / 1e12:.1f} TFLOP/s dense bf16); data preparation and compilation not "
                 f"counted (dry run: nothing was run)")
    return "\n".join(lines)
