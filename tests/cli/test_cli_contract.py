"""The command line's contract, every validation branch and every verb's error paths through main():
one line on stderr starting `error:`, exit 2 for usage and 1 for runtime, no traceback, no file
left behind (no run directory, no ledger line, no half-written output).

`test_every_validation_branch_is_driven` guards the table itself: it records where each UsageError
of a run below was raised and fails when a `UsageError(` site of the config layer is reached by no
case, so a new validation branch needs a case here.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest
import torch

import muonlab
from muonlab.cli import main
from muonlab.errors import UsageError

TINY = ["train", "--preset", "cpu-tiny"]
# a plug-in conditioner with a check no range states (two options against each other)
CHECKED_CONDITIONER = """
from dataclasses import dataclass
from muonlab.optim import PrePolar, register_prepolar
from muonlab.optim.extensions import option

@dataclass(frozen=True)
class Clip(PrePolar):
    low: float = option(0.1, "lower clip")
    high: float = option(1.0, "upper clip")

    def __post_init__(self):
        super().__post_init__()
        if not self.low < self.high:
            raise ValueError(f"prepolar_low must be below prepolar_high, got {self.low} and {self.high}")

    def condition(self, G, inputs, ctx):
        return G.clamp(self.low, self.high)

register_prepolar("contract_clip", Clip, paper="none (contract test)")
"""
TIED = ["train", "--preset", "tied-cpu"]
USAGE, RUNTIME = 2, 1

from support.plugin_sources import CONDITIONER  # noqa: E402 (a plug-in that registers a conditioner)
from support.tiers import read_record  # noqa: E402


def _ledger_line(tmp: Path, record: dict) -> Path:
    path = tmp / "in" / "ledger.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
    return path


def _run_dir(tmp: Path, config: dict | None) -> Path:
    run = tmp / "in" / "run"
    run.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (run / "config.json").write_text(json.dumps(config))
    return run


def _file(tmp: Path, name: str, text: str) -> Path:
    path = tmp / "in" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _trained(tmp: Path, preset: str) -> Path:
    """A finished 2-step run of the preset, under the case's inputs (its runs and cache)."""
    assert main(["train", "--preset", preset, "--num-steps", "2", "--quiet", "--runs-dir", str(tmp / "in" / "runs"),
                 "--cache-dir", str(tmp / "in" / "cache")]) == 0
    return next(d for d in (tmp / "in" / "runs").iterdir() if d.is_dir())


def _damaged_weights(tmp: Path) -> Path:
    run = _trained(tmp, "cpu-tiny")
    (run / "model.safetensors").write_bytes((run / "model.safetensors").read_bytes()[:100])  # a truncated copy
    return run


def _without_checkpoints(tmp: Path) -> Path:
    run = _trained(tmp, "cpu-tiny")
    for path in (run / "checkpoints").iterdir():
        path.unlink()
    return run


def _ledger_with_a_run(tmp: Path) -> Path:
    run = _trained(tmp, "cpu-tiny")
    return run.parent / "ledger.jsonl"


def _slurm_path(tmp: Path, *tools: str) -> str:
    """A PATH holding only fake SLURM tools: `sbatch` refuses every array (as a bad partition does),
    `srun` answers; without tools, a PATH with no SLURM at all."""
    scripts = {"sbatch": "echo 'sbatch: error: Batch job submission failed: Invalid partition name specified' >&2\n"
                         "exit 1\n", "srun": "echo srun\n"}
    folder = tmp / "in" / "bin"
    folder.mkdir(parents=True, exist_ok=True)
    for tool in tools:
        _file(tmp, f"bin/{tool}", "#!/bin/sh\n" + scripts[tool]).chmod(0o755)
    return str(folder)


# environment a case runs under (the variable's value from the case's scratch folder)
CASE_ENV = {
    "paper-run-slurm-without-slurm": {"PATH": lambda t: _slurm_path(t)},
    "paper-run-slurm-refuses-the-array": {"PATH": lambda t: _slurm_path(t, "sbatch", "srun")},
    "paper-run-slurm-without-srun": {"PATH": lambda t: _slurm_path(t, "sbatch")},
}


def _run_of_a_changed_plugin(tmp: Path) -> Path:
    """A run directory whose config recorded a plug-in's source digest that its file no longer has."""
    from muonlab.arms import resolve_config

    plugin = _file(tmp, "changed_conditioner.py", CONDITIONER.replace("plugin_sign", "contract_changed_sign"))
    config = resolve_config("baseline", "cpu-tiny", {"record.plugins": str(plugin)}).to_dict()
    _file(tmp, "run/config.json", json.dumps({"config": {**config, "plugin_code": {str(plugin): "0" * 16}}}))
    return tmp / "in" / "run"


def _study(tmp: Path, extra: str = "", preset: str = '"cpu-tiny"', seeds: str = "[1]",
           arms: str = "[arms.baseline]") -> Path:
    """An experiment file, with one line changed for a case."""
    return _file(tmp, "study.toml", f"preset = {preset}\nseeds = {seeds}\n{extra}\n{arms}\n")


# (id, argv, exit code, a fragment the one-line message must contain). An argv item "{tmp}"
# is the test's scratch folder for inputs; callables build an input there and return its path.
CASES = [
    # --- the parser
    ("unknown-flag", TINY + ["--bogus"], USAGE, "unknown option --bogus"),
    ("no-verb", [], USAGE, "required"),
    ("unknown-verb", ["fly"], USAGE, "invalid choice"),
    ("bad-choice", TINY + ["--precision", "fp8"], USAGE, "precision"),
    ("unknown-preset", ["train", "--preset", "nope"], USAGE, "invalid choice"),
    # --- value coercion (settings.coerce)
    ("int-expected", TINY + ["--depth", "two"], USAGE, "expects int"),
    ("float-expected", TINY + ["--matrix-lr", "fast"], USAGE, "expects float"),
    ("bool-expected", TINY + ["--checkpoint-blocks", "maybe"], USAGE, "expects bool"),
    ("literal-choice", TINY + ["--compile", "maybe"], USAGE, "must be one of"),
    ("none-not-allowed", lambda t: ["train", "--config", str(_file(t, "c.json", json.dumps(
        {"train": {"num_steps": 3}, "model": {"depth": None}})))], USAGE, "depth cannot be none"),
    ("wrong-json-type", lambda t: ["train", "--config", str(_file(t, "c.json", json.dumps(
        {"model": {"depth": "x"}})))], USAGE, "expects int"),
    ("json-float-for-int", lambda t: ["train", "--config", str(_file(t, "c.json", json.dumps(
        {"model": {"depth": 2.5}})))], USAGE, "expects int"),
    # --- config files (config.py, settings.set_dotted)
    ("config-missing", ["train", "--config", "/nonexistent/config.json"], USAGE, "config file not found"),
    ("config-not-json", lambda t: ["train", "--config", str(_file(t, "c.json", "{nope"))], USAGE, "not a JSON config"),
    ("config-not-object", lambda t: ["train", "--config", str(_file(t, "c.json", "[1, 2]"))], USAGE,
     "does not hold a config object"),
    ("config-unknown-key", lambda t: ["train", "--config", str(_file(t, "c.json", json.dumps(
        {"model": {"colour": 3}})))], USAGE, "model.colour is not a setting"),
    ("config-group-as-value", lambda t: ["train", "--config", str(_file(t, "c.json", json.dumps(
        {"model": {"qk": 3}})))], USAGE, "is a group of settings"),
    ("config-unknown-section", lambda t: ["train", "--config", str(_file(t, "c.json", json.dumps(
        {"garden": {"x": 1}})))], USAGE, "not a setting"),
    ("config-path-through-a-setting", lambda t: ["train", "--config", str(_file(t, "c.json", json.dumps(
        {"family": "autoresearch", "model": {"depth": {"x": 1}}})))], USAGE, "model.depth.x is not a setting"),
    ("config-key-of-another-family", lambda t: ["train", "--config", str(_file(t, "c.json", json.dumps(
        {"family": "tied", "model": {"window_pattern": "SL"}})))], USAGE, "does not act on model family tied"),
    ("config-family-not-a-name", lambda t: ["train", "--config", str(_file(t, "c.json", json.dumps(
        {"family": 3})))], USAGE, "model family must be a name"),
    ("unknown-family", TINY + ["--model-family", "rnn"], USAGE, "rnn"),
    # --- settings that do not act are refused
    ("flag-of-another-family", TIED + ["--n-embd", "128"], USAGE, "does not act on model family tied"),
    ("key-of-another-family", TIED + ["--matrix-lr", "0.03"], USAGE, "does not act on model family tied"),
    ("inert-flag", TINY + ["--whiten-tau", "25"], USAGE, "does not act"),
    ("inert-under-adamw", TINY + ["--matrix-optimizer", "adamw", "--matrix-lr", "0.05"], USAGE, "does not act"),
    ("resume-with-settings", lambda t: ["train", "--resume", str(_run_dir(t, None)), "--depth", "3"], USAGE,
     "give no other settings"),
    # --- training (config/run.py)
    ("batch-not-divisible", TINY + ["--device-batch-size", "3"], USAGE, "not divisible by device_batch_size"),
    ("batch-below-one", TINY + ["--device-batch-size", "0"], USAGE, "(train.device_batch_size) must be >= 1"),
    ("steps-and-budget", lambda t: ["train", "--config", str(_file(t, "c.json", json.dumps(
        {"train": {"num_steps": 3, "time_budget": 5.0}})))], USAGE, "exactly one of num_steps and time_budget"),
    ("zero-steps", TINY + ["--num-steps", "0"], USAGE, "num_steps"),
    ("negative-budget", TINY + ["--num-steps", "none", "--time-budget", "-1"], USAGE, "(train.time_budget) must be > 0"),
    ("negative-untimed", TINY + ["--untimed-steps", "-1"], USAGE, "(train.untimed_steps) must be >= 0"),
    ("negative-clip", TINY + ["--grad-clip", "-1"], USAGE, "(train.grad_clip) must be >= 0"),
    ("eval-batch-zero", TINY + ["--eval-batch-size", "0"], USAGE, "(train.eval_batch_size) must be >= 1"),
    ("eval-every-negative", TINY + ["--eval-every", "-1"], USAGE, "(train.eval_every) must be >= 0"),
    # --- ranges (issue 47): an interval, a bound on a count, the model against memory, refused before any file
    ("max-loss-zero", TINY + ["--max-loss", "0"], USAGE, "(train.max_loss) must be > 0, got 0"),
    ("max-loss-negative", TINY + ["--max-loss", "-1"], USAGE, "(train.max_loss) must be > 0, got -1"),
    ("momentum-start-above-one", TINY + ["--muon-momentum-start", "2"], USAGE,
     "(optim.muon_momentum_start) must be in [0, 1), got 2"),
    ("momentum-end-negative", TINY + ["--muon-momentum-end", "-3"], USAGE, "(optim.muon_momentum_end) must be in [0, 1)"),
    ("momentum-warmup-negative", TINY + ["--muon-momentum-warmup-steps", "-5"], USAGE,
     "(optim.muon_momentum_warmup_steps) must be >= 0, got -5"),
    ("final-lr-frac-above-one", TINY + ["--final-lr-frac", "2"], USAGE, "(schedule.final_lr_frac) must be in [0, 1], got 2"),
    ("final-lr-frac-negative", TINY + ["--final-lr-frac", "-1"], USAGE, "(schedule.final_lr_frac) must be in [0, 1], got -1"),
    ("eval-tokens-huge", TINY + ["--eval-tokens", "99999999999999999999"], USAGE,
     "(train.eval_tokens) must be <= 1e+15 (more tokens than any dataset)"),
    ("num-steps-huge", TINY + ["--num-steps", "99999999999999999999999999"], USAGE,
     "(train.num_steps) must be <= 1e+12 (a count no run reaches)"),
    ("depth-huge", TINY + ["--depth", "99999999999999999999"], USAGE, "(model.depth) must be <= 1e+12"),
    ("model-beyond-memory", TINY + ["--depth", "2000"], USAGE, "GiB to train, this machine has"),
    ("micro-batches-huge", ["diagnose", "tied", "--micro-batches", "99999999999999999999"], USAGE,
     "must be <= 1000000000000 (a count no run reaches)"),
    ("fallback-without-resume", TINY + ["--fallback"], USAGE, "--fallback picks the checkpoint --resume continues"),
    ("eval-empty-split", lambda t: ["eval", str(t / "nowhere"), "--splits", "val,,holdout"], USAGE,
     "--splits 'val,,holdout' has an empty element"),
    ("doctor-empty-skip", ["doctor", "--gpu", "--plan", "--skip", "pytest,,throughput"], USAGE,
     "--skip 'pytest,,throughput' has an empty element"),
    ("paper-empty-gpu", ["paper", "run", "000-t1", "--dry-run", "--gpu", ""], USAGE, "--gpu names a GPU"),
    ("miniature-steps-alone", ["paper", "run", "000-t1", "--miniature-steps", "12"], USAGE, "add --miniature"),
    ("eval-every-tokens-short", TINY + ["--eval-every", "2", "--eval-every-tokens", "8"], USAGE,
     "eval_every_tokens (8) must be at least sequence_len"),
    ("eval-tokens-too-few", TINY + ["--eval-tokens", "10"], USAGE, "eval_tokens (10) must be at least sequence_len"),
    ("schedule-ratios", TINY + ["--warmup-ratio", "0.7", "--warmdown-ratio", "0.6"], USAGE, "warmup_ratio"),
    # --- data (data/config.py)
    ("local-without-path", TINY + ["--source", "local"], USAGE, "needs --path"),
    ("family-cannot-read-source", ["train", "--preset", "imagegpt-cpu", "--source", "stdlib"], USAGE,
     "does not read data source 'stdlib'"),
    ("synthetic-images-one", ["train", "--preset", "imagegpt-cpu", "--synthetic-images", "1"], USAGE,
     "--synthetic-images (data.synthetic_images) must be >= 2, got 1"),
    ("memmap-without-path", ["train", "--preset", "hf-cpu", "--source", "memmap"], USAGE, "needs --path"),
    ("images-without-path", ["train", "--preset", "imagegpt-cpu", "--source", "images"], USAGE, "needs --path"),
    ("local-path-missing", TINY + ["--source", "local", "--path", "/nonexistent/corpus"], USAGE,
     "/nonexistent/corpus"),
    ("max-doc-chars", TINY + ["--source", "local", "--path", "{tmp}", "--max-doc-chars", "3"], USAGE,
     "--max-doc-chars (data.max_doc_chars) must be >= 16, got 3"),
    ("num-shards", TINY + ["--source", "climbmix", "--num-shards", "0"], USAGE, "num_shards"),
    ("download-workers", TINY + ["--source", "climbmix", "--download-workers", "0"], USAGE,
     "--download-workers (data.download_workers) must be >= 1, got 0"),
    ("tokenizer-json-autoresearch", TINY + ["--source", "local", "--path", "/tmp", "--tokenizer-json", "tok.json"],
     USAGE, "--tokenizer-json does not act on model family autoresearch"),
    ("base-url-not-a-hub-dataset", TINY + ["--source", "climbmix", "--base-url", "http://example.org/shards"], USAGE,
     "must name a Hugging Face dataset"),
    ("download-retries", TINY + ["--source", "climbmix", "--download-retries", "0"], USAGE,
     "--download-retries (data.download_retries) must be >= 1, got 0"),
    ("download-timeout", TINY + ["--source", "climbmix", "--download-timeout-s", "0"], USAGE,
     "--download-timeout-s (data.download_timeout_s) must be > 0, got 0"),
    ("vocab-too-small", TINY + ["--vocab-size", "100"], USAGE, "--vocab-size (data.vocab_size) must be >= 260, got 100"),
    ("tokenizer-chars", TINY + ["--tokenizer-max-chars", "0"], USAGE,
     "--tokenizer-max-chars (data.tokenizer_max_chars) must be >= 1, got 0"),
    ("val-fraction", TINY + ["--val-fraction", "0"], USAGE, "--val-fraction (data.val_fraction) must be in (0, 1), got 0"),
    ("fractions-sum", TINY + ["--val-fraction", "0.6", "--holdout-fraction", "0.5"], USAGE, "leave a train split"),
    ("synthetic-bytes", TINY + ["--synthetic-bytes", "10"], USAGE,
     "--synthetic-bytes (data.synthetic_bytes) must be >= 1000, got 10"),
    ("synthetic-branching", TINY + ["--synthetic-words", "4", "--synthetic-branching", "4"], USAGE,
     "synthetic_branching must be below synthetic_words, got 4 and 4"),
    ("synthetic-doc-words", TINY + ["--synthetic-doc-words", "1"], USAGE,
     "--synthetic-doc-words (data.synthetic_doc_words) must be >= 2, got 1"),
    # --- record (record/config.py, record/sinks.py)
    ("trajectory-steps", TINY + ["--trajectory-steps", "0,x"], USAGE, "trajectory_steps"),
    ("log-every", TINY + ["--log-every", "0"], USAGE, "--log-every (record.log_every) must be >= 1, got 0"),
    ("checkpoint-keep", TINY + ["--checkpoint-keep", "0"], USAGE,
     "--checkpoint-keep (record.checkpoint_keep) must be >= 1, got 0"),
    ("unknown-sink", TINY + ["--sinks", "carrier-pigeon"], USAGE, "unknown metric sink"),
    # --- the autoresearch model and optimizer
    ("depth-zero", TINY + ["--depth", "0"], USAGE, "(model.depth) must be >= 1"),
    ("width-not-divisible", TINY + ["--n-embd", "100"], USAGE, "not divisible by head_dim"),
    ("odd-head-dim", TINY + ["--n-embd", "99", "--head-dim", "33"], USAGE, "head_dim must be even"),
    ("too-narrow", TINY + ["--n-embd", "16", "--head-dim", "16"], USAGE, "width must be >= 32"),
    ("kv-heads", TINY + ["--n-embd", "96", "--n-kv-head", "2"], USAGE, "not a multiple of n_kv_head"),
    ("window-pattern", TINY + ["--window-pattern", "SXL"], USAGE, "window_pattern"),
    ("unknown-plugin-variant", TINY + ["--variant", "nonesuch"], USAGE, "not a registered plug-in variant"),
    ("negative-lr", TINY + ["--matrix-lr", "-0.1"], USAGE, "--matrix-lr (optim.matrix_lr) must be >= 0, got -0.1"),
    ("beta-range", TINY + ["--adam-beta1", "1.0"], USAGE, "--adam-beta1 (optim.adam_beta1) must be in [0, 1), got 1"),
    ("lr-scale", TINY + ["--lr-scale", "0"], USAGE, "--lr-scale (optim.lr_scale) must be > 0, got 0"),
    ("adamw-matrix-lr", TINY + ["--matrix-optimizer", "adamw", "--adamw-matrix-lr", "-1"], USAGE, "adamw_matrix_lr"),
    ("step0-mode-unknown", TINY + ["--step0-mode", "nope"], USAGE, "step0_mode must be one of"),
    ("homotopy-first-t", TINY + ["--prepolar", "hbieq", "--homotopy-first-t", "2"], USAGE,
     "homotopy_first_t must be 0 or 1"),
    ("prepolar-unknown", TINY + ["--prepolar", "nope"], USAGE, "prepolar must be one of"),
    ("step0-needs-routing", TINY + ["--step0-mode", "nostep0"], USAGE, "set routing"),
    ("table-whiten-needs-oe", TINY + ["--table-whiten", "neumann"], USAGE, "set oe_m"),
    ("variant-lr-mult", TINY + ["--qk-scale", "head_temp", "--qk-lr-mult", "-1"], USAGE,
     "--qk-lr-mult (model.qk.lr_mult) must be >= 0, got -1"),
    ("gpt-config", TINY + ["--oe-m", "7", "--oe-k", "5"], USAGE, "must be a positive multiple of"),
    ("oe-order", TINY + ["--oe-m", "7", "--oe-n", "1"], USAGE, "--oe-n (model.oe.n) must be >= 2, got 1"),
    ("oe-negative", TINY + ["--oe-m", "-1"], USAGE, "--oe-m (model.oe.m) must be >= 0, got -1"),
    ("qk-freeze-layers", TINY + ["--qk-scale", "pair_tied_exp", "--qk-freeze-layers", "a,b"], USAGE,
     "qk_freeze_layers"),
    ("loss-chunk", TINY + ["--loss-chunk-tokens", "-1"], USAGE, "loss_chunk_tokens"),
    ("prepolar-passes", TINY + ["--prepolar", "hbieq", "--prepolar-passes", "0"], USAGE,
     "--prepolar-passes (optim.prepolar.passes) must be >= 1, got 0"),
    ("prepolar-plugin-check", lambda t: TINY + ["--plugin", str(_file(t, "clip.py", CHECKED_CONDITIONER)),
                                                "--prepolar", "contract_clip", "--prepolar-low", "2"], USAGE,
     "prepolar contract_clip: prepolar_low must be below prepolar_high, got 2.0 and 1.0"),
    ("whiten-terms", TINY + ["--whiten", "neumann", "--whiten-terms", "0"], USAGE,
     "--whiten-terms (optim.whiten.terms) must be >= 1, got 0"),
    ("table-whiten-tau", TINY + ["--oe-m", "3", "--table-whiten", "neumann", "--table-whiten-tau", "-1"],
     USAGE, "--table-whiten-tau (optim.table_whiten.tau) must be >= 0, got -1"),
    # --- the tied family (AF-Muon)
    ("sign-cap", TIED + ["--arm", "t1_sign", "--af-cap", "2"], USAGE, "sign fixes af_cap = 1"),
    ("af-cap-below-one", TIED + ["--af-cap", "0.5"], USAGE, "--af-cap (optim.cap) must be >= 1, got 0.5"),
    ("paper-run-needs-a-table", ["paper", "run"], USAGE, "muonlab paper run takes TABLE ... "),
    ("paper-run-on-a-gpu-preset-without-one", ["paper", "run", "004-k8"], USAGE, "made for a GPU"),
    ("paper-all-with-tables", ["paper", "run", "004-k8", "--all", "--miniature"], USAGE, "--all runs every table"),
    ("paper-miniature-and-preset", ["paper", "004-k8", "--miniature", "--preset", "tied-cpu"], USAGE, "drop --preset"),
    ("paper-table-of-another-kind", ["paper", "004-t1-protein", "--preset", "tied-cpu"], USAGE, "family"),
    ("tied-width-not-heads", TIED + ["--tied-n-embd", "100"], USAGE, "multiple of tied-tiny's head dim 32"),
    ("t5gemma2-untied", ["train", "--preset", "t5gemma2-cpu", "--t5-tied", "false", "--optimizer", "hybrid"], USAGE,
     "T5Gemma2 is trained tied only"),
    ("reuse-needs-untied-optimizer", ["train", "--preset", "reuse-cpu", "--optimizer", "sign"], USAGE,
     "K.9 shared-MLP model is untied"),
    # --- arms, sweeps, executors, devices
    ("unknown-arm", TINY + ["--arm", "nonesuch"], USAGE, "unknown arm"),
    ("sweep-unknown-preset", ["sweep", "--arms", "baseline", "--seeds", "1", "--preset", "nope"], USAGE, "nope"),
    ("sweep-bad-seeds", ["sweep", "--arms", "baseline", "--seeds", "1,x", "--preset", "cpu-tiny"], USAGE,
     "seeds must be comma-separated integers"),
    ("sweep-repeated-seeds", ["sweep", "--arms", "baseline", "--seeds", "1,1", "--preset", "cpu-tiny"], USAGE,
     "without repeats"),
    ("sweep-repeated-arms", ["sweep", "--arms", "baseline,baseline", "--seeds", "1", "--preset", "cpu-tiny"],
     USAGE, "arms must be a non-empty list"),
    ("sweep-no-common-seeds", ["sweep", "--arms", "baseline,t1_afmuon", "--preset", "cpu-tiny"], USAGE, "--seeds"),
    ("sweep-parallel", ["sweep", "--arms", "baseline", "--seeds", "1", "--preset", "cpu-tiny", "--parallel", "0"],
     USAGE, "argument --parallel: must be >= 1, got 0"),
    ("sweep-gpus-per-run", ["sweep", "--arms", "baseline", "--seeds", "1", "--preset", "cpu-tiny",
                            "--gpus-per-run", "0"], USAGE, "argument --gpus-per-run: must be >= 1, got 0"),
    ("sweep-gpus-per-run-and-slurm-shape", ["sweep", "--arms", "baseline", "--seeds", "1", "--preset", "cpu-tiny",
                                            "--executor", "slurm", "--gpus-per-run", "2", "--slurm", "tasks_per_node=4"],
     USAGE, "both shape the runs"),
    ("sweep-nodes-local", ["sweep", "--arms", "baseline", "--seeds", "1", "--preset", "cpu-tiny", "--nodes", "2"],
     USAGE, "--nodes is for --executor slurm"),
    ("sweep-nodes-zero", ["sweep", "--arms", "baseline", "--seeds", "1", "--preset", "cpu-tiny", "--executor", "slurm",
                          "--nodes", "0"], USAGE, "must be >= 1"),
    ("sweep-detach-local", ["sweep", "--arms", "baseline", "--seeds", "1", "--preset", "cpu-tiny", "--detach"],
     USAGE, "--detach is for --executor slurm"),
    ("sweep-detach-slurm-local-cluster", ["sweep", "--arms", "baseline", "--seeds", "1", "--preset", "cpu-tiny",
                                          "--executor", "slurm", "--slurm", "cluster=local", "--detach"],
     USAGE, "--detach leaves the runs to SLURM"),
    ("sweep-parallel-slurm", ["sweep", "--arms", "baseline", "--seeds", "1", "--preset", "cpu-tiny",
                              "--executor", "slurm", "--parallel", "2"], USAGE, "slurm_array_parallelism"),
    ("sweep-slurm-options-local", ["sweep", "--arms", "baseline", "--seeds", "1", "--preset", "cpu-tiny",
                                   "--slurm", "timeout_min=5"], USAGE, "--slurm options are for --executor slurm"),
    ("checkpoint-minutes", TINY + ["--checkpoint-minutes", "-1"], USAGE,
     "--checkpoint-minutes (record.checkpoint_minutes) must be >= 0, got -1"),
    ("checkpoint-minutes-inf", TINY + ["--checkpoint-minutes", "inf"], USAGE,
     "--checkpoint-minutes (record.checkpoint_minutes) must be a finite number, got inf"),
    ("checkpoint-minutes-nan", TINY + ["--checkpoint-minutes", "nan"], USAGE, "(record.checkpoint_minutes) must be a finite"),
    ("sweep-no-arms", ["sweep", "--preset", "cpu-tiny"], USAGE, "needs --arms"),
    ("sweep-status-nothing", ["sweep", "--status", "--preset", "cpu-tiny"], USAGE, "needs the sweep's --arms"),
    ("sweep-status-detach", ["sweep", "--status", "--detach", "--arms", "baseline"], USAGE, "drop --detach"),
    ("sweep-executor", ["sweep", "--arms", "baseline", "--seeds", "1", "--preset", "cpu-tiny", "--executor", "ray"],
     USAGE, "ray"),
    ("sweep-slurm-option", ["sweep", "--arms", "baseline", "--seeds", "1", "--preset", "cpu-tiny",
                            "--executor", "slurm", "--slurm", "partition"], USAGE, "KEY=VALUE"),
    ("sweep-slurm-requeue", ["sweep", "--arms", "baseline", "--seeds", "1", "--preset", "cpu-tiny",
                             "--executor", "slurm", "--slurm", "requeue=maybe"], USAGE, "requeue must be true or false"),
    ("sweep-slurm-unknown", ["sweep", "--arms", "baseline", "--seeds", "1", "--preset", "cpu-tiny",
                             "--executor", "slurm", "--slurm", "colour=red"], USAGE, "unknown --slurm option"),
    ("unknown-device", TINY + ["--device", "tpu"], USAGE, "unknown device"),
    ("device-unavailable", TINY + ["--device", "mps"], USAGE, "MPS is not available"),
    # a preset made for a GPU on a machine without one: refused before any data or run (--device cpu insists)
    ("gpu-preset-without-gpu", ["train"], USAGE, "add --device cpu to run it on the CPU anyway"),
    ("gpu-preset-without-gpu-names-cpu-presets", ["train", "--preset", "nanogpt-124m"], USAGE, "cpu-tiny"),
    ("gpu-preset-sweep-without-gpu", ["sweep", "--arms", "baseline", "--seeds", "1", "--preset", "gpu-d6"], USAGE,
     "--device cpu"),
    # --- plug-ins
    ("plugin-file-missing", TINY + ["--plugin", "/nonexistent/plugin.py"], USAGE, "plug-in file not found"),
    ("plugin-import-fails", lambda t: TINY + ["--plugin", str(_file(t, "p.py", "raise ValueError('broken')"))],
     USAGE, "failed to import"),
    ("plugin-exits-at-import", lambda t: TINY + ["--plugin", str(_file(t, "exits.py", "import sys\nsys.exit(3)\n"))],
     USAGE, "it called sys.exit(3) while importing"),
    ("plugin-multiline-error", lambda t: TINY + ["--plugin", str(_file(t, "multi.py", "raise ValueError('one\\ntwo')"))],
     USAGE, "ValueError: one two"),
    ("plugin-registers-nothing", lambda t: TINY + ["--plugin", str(_file(t, "empty.py", "X = 1\n"))], USAGE,
     "registers nothing"),
    ("plugin-module-registers-nothing", TINY + ["--plugin", "json"], USAGE, "--plugin json registers nothing"),
    ("plugin-module-missing", TINY + ["--plugin", "no_such_module_xyz"], USAGE, "cannot be imported"),
    ("methods-plugin", ["methods", "--plugin", "/nonexistent/plugin.py"], USAGE, "plug-in file not found"),
    # --- resume
    ("resume-not-a-run", lambda t: ["train", "--resume", str(_run_dir(t, None))], USAGE, "not a run directory"),
    ("resume-format-1", lambda t: ["train", "--resume", str(_run_dir(t, {"config": {"depth": 2, "arm": "baseline"}}))],
     USAGE, "older muonlab"),
    # --- ad-hoc arms (--arm-name) and experiment files
    ("arm-name-not-a-file-name", TINY + ["--arm-name", "a/b", "--prepolar", "hbieq"], USAGE, "names files"),
    ("arm-name-taken", TINY + ["--arm-name", "exp05_gains_qk_linear", "--prepolar", "hbieq"], USAGE,
     "already defined with other overrides"),
    ("arm-name-recorded", lambda t: TINY + ["--arm-name", "mine", "--prepolar", "hbieq", "--runs-dir", str(
        _ledger_line(t, {"run_id": "r", "arm": "mine", "seed": 42, "status": "ok", "config": {"layers": [
            {"origin": "arm", "values": {"optim.prepolar.kind": "zeta"}}]}}).parent)], USAGE, "recorded in"),
    ("arm-name-with-config", lambda t: ["train", "--arm-name", "x", "--config", str(_file(t, "c.json", json.dumps(
        {"model": {"depth": 2}})))], USAGE, "--config starts from a saved config"),
    ("arm-name-nothing", TINY + ["--arm-name", "x", "--num-steps", "2"], USAGE, "none was given"),
    ("experiment-and-arms", lambda t: ["sweep", "--experiment", str(_study(t)), "--arms", "baseline"], USAGE,
     "drop --arms"),
    ("experiment-and-preset", lambda t: ["sweep", "--experiment", str(_study(t)), "--preset", "gpu-d6"], USAGE,
     "drop --preset gpu-d6"),
    ("experiment-missing", ["sweep", "--experiment", "/nonexistent/study.toml"], USAGE, "experiment file not found"),
    ("experiment-not-toml", lambda t: ["sweep", "--dry-run", "--experiment", str(_file(t, "s.toml", "preset = "))],
     USAGE, "not a TOML experiment file"),
    ("experiment-unknown-key", lambda t: ["sweep", "--dry-run", "--experiment", str(_study(t, 'colour = "red"'))],
     USAGE, "unknown key 'colour'"),
    ("experiment-no-preset", lambda t: ["sweep", "--dry-run", "--experiment", str(_study(t, preset="3"))], USAGE,
     "`preset` must name a preset"),
    ("experiment-no-arms", lambda t: ["sweep", "--dry-run", "--experiment", str(_file(
        t, "s.toml", 'preset = "cpu-tiny"'))], USAGE, "[arms.NAME]"),
    ("experiment-bad-seeds", lambda t: ["sweep", "--dry-run", "--experiment", str(_study(t, seeds="[1, 1]"))],
     USAGE, "distinct integers"),
    ("experiment-bad-baseline", lambda t: ["sweep", "--dry-run", "--experiment", str(_study(
        t, 'baseline = "other"'))], USAGE, "is not one of the file's arms"),
    ("experiment-bad-settings", lambda t: ["sweep", "--dry-run", "--experiment", str(_study(t, 'settings = 3'))],
     USAGE, "must be a table of settings"),
    ("experiment-bad-plugins", lambda t: ["sweep", "--dry-run", "--experiment", str(_study(t, 'plugins = "a.py"'))],
     USAGE, "`plugins` must be a list"),
    ("experiment-arm-not-table", lambda t: ["sweep", "--dry-run", "--experiment", str(_study(
        t, arms='arms = { baseline = 3 }'))], USAGE, "arms.baseline must be a table"),
    ("experiment-arm-base-type", lambda t: ["sweep", "--dry-run", "--experiment", str(_study(
        t, arms='[arms.mine]\nbase = 3\ndepth = 3'))], USAGE, "`base` and `description` are strings"),
    ("experiment-arm-bad-value", lambda t: ["sweep", "--dry-run", "--experiment", str(_study(
        t, arms='[arms.mine]\ndepth = "deep"'))], USAGE, "arms.mine: model.depth expects int"),
    # --- eval (train/rescore.py)
    ("eval-not-a-run", ["eval", "/nonexistent/run"], USAGE, "is not a run directory"),
    ("eval-bad-splits", lambda t: ["eval", str(_run_dir(t, {"model": {"depth": 2}})), "--splits", "train"], USAGE,
     "--splits takes val and/or holdout"),
    ("eval-legacy", lambda t: ["eval", str(_run_dir(t, {"depth": 2}))], USAGE, "config format 1"),
    ("eval-no-weights", lambda t: ["eval", str(_run_dir(t, {"model": {"depth": 2}}))], USAGE, "has no final weights"),
    ("eval-no-checkpoint", lambda t: ["eval", str(_run_dir(t, {"model": {"depth": 2}})), "--step", "3"], USAGE,
     "has no checkpoint after step 3 (it kept no checkpoint)"),
    # --- report
    # --- damaged inputs: one class (CorruptInput), exit 1, the file named
    ("eval-damaged-weights", lambda t: ["eval", str(_damaged_weights(t))], RUNTIME, "model.safetensors is damaged"),
    ("images-not-an-npz", lambda t: ["train", "--preset", "imagegpt-cpu", "--source", "images", "--path",
                                     str(_file(t, "x.npz", "hello"))], RUNTIME, "x.npz is not a .npz array file"),
    ("images-truncated-npz", lambda t: ["train", "--preset", "imagegpt-cpu", "--source", "images", "--path",
                                        str(_file(t, "y.npz", "PK\x03\x04junk"))], RUNTIME,
     "y.npz is not a readable .npz array file (BadZipFile"),
    ("ledger-recover-malformed-line", lambda t: ["ledger", "recover", str(_file(t, "runs/r1/ledger_line.json",
                                                                                 '{"a": 1').parent.parent)],
     RUNTIME, "ledger_line.json is not a ledger line"),
    ("experiment-arm-setting-unknown", lambda t: ["sweep", "--dry-run", "--experiment", str(_study(
        t, arms='[arms.a]\nmodel.depth = 0'))], USAGE, "study.toml: arms.a: model.depth must be >= 1"),
    ("diagnose-without-a-checkpoint", lambda t: ["diagnose", "geometry", "--run", str(_without_checkpoints(t))],
     USAGE, "holds no checkpoint: the diagnostics read the model and optimizer from one"),
    ("report-tsv-unwritable", lambda t: ["report", "--ledger", str(_ledger_line(t, {"arm": "baseline", "seed": 1,
     "status": "ok"})), "--tsv", "/proc/muonlab.tsv"], USAGE, "--tsv /proc/muonlab.tsv: cannot write"),
    ("report-protocol-free-without-such-lines", lambda t: ["report", "--ledger", str(_ledger_with_a_run(t)),
                                                           "--protocol-free"], USAGE, "drop --protocol-free"),
    ("sweep-status-ledger-missing", ["sweep", "--status", "--ledger", "/nonexistent/ledger.jsonl"], USAGE,
     "ledger not found"),
    ("sweep-status-ledger-a-directory", lambda t: ["sweep", "--status", "--ledger", str(t / "in")], USAGE,
     "is a directory; give the ledger file"),
    ("paper-ledger-a-directory", lambda t: ["paper", "000-t1", "--ledger", str(t / "in")], USAGE,
     "is a directory; give the ledger file"),
    ("unknown-option-before-the-verb", ["--helpp"], USAGE, "unknown option --helpp before the verb"),
    ("flex-off-cuda-before-the-run-directory", TINY + ["--attn-backend", "flex"], USAGE, "needs a CUDA device"),
    ("report-no-ledger", ["report", "--ledger", "/nonexistent/ledger.jsonl"], USAGE, "ledger not found"),
    ("report-two-points", lambda t: ["report", "--ledger", str(_ledger_line(t, {"arm": "baseline", "seed": 1,
     "status": "ok"})), "--at-step", "5", "--at-tokens", "5k"], USAGE, "not both"),
    ("report-bad-tokens", lambda t: ["report", "--ledger", str(_ledger_line(t, {"arm": "baseline", "seed": 1,
     "status": "ok"})), "--at-tokens", "lots"], USAGE, "argument --at-tokens: expects a token count"),
    ("report-no-ok-run", lambda t: ["report", "--ledger", str(_ledger_line(
        t, {"arm": "baseline", "seed": 1, "status": "failed"}))], RUNTIME, "no runs with status 'ok'"),
    ("report-unknown-baseline", lambda t: ["report", "--ledger", str(_ledger_line(
        t, {"arm": "a", "seed": 1, "status": "ok", "protocol": "0123456789abcdef", "metrics": {"val_bpb": 1.0}})), "--baseline", "zzz"],
     USAGE, "zzz"),
    ("report-unknown-metric", lambda t: ["report", "--ledger", str(_ledger_line(
        t, {"arm": "baseline", "seed": 1, "status": "ok", "protocol": "0123456789abcdef", "metrics": {"val_bpb": 1.0}})), "--metric", "speed"],
     USAGE, "speed"),
    # --- verify-reference
    ("verify-missing", ["verify-reference", "/nonexistent/bundle.pt"], USAGE, "/nonexistent/bundle.pt"),
    ("verify-not-a-bundle", lambda t: ["verify-reference", str(_file(t, "b.pt", "not a bundle"))], USAGE, "b.pt"),
    # --- diagnose
    ("diagnose-needs-run", ["diagnose", "geometry"], USAGE, "--run"),
    ("diagnose-run-missing", ["diagnose", "geometry", "--run", "/nonexistent/run"], USAGE, "/nonexistent/run"),
    ("diagnose-unknown-arm", ["diagnose", "accounting", "--arms", "nope"], USAGE, "nope"),
    ("diagnose-empty-arms", ["diagnose", "accounting", "--arms", ","], USAGE, "--arms names at least one arm"),
    # --- doctor (checked before CUDA is, so the same on every machine)
    ("doctor-needs-a-check", ["doctor"], USAGE, "--gpu"),
    ("doctor-tests-missing", ["doctor", "--gpu", "--tests", "/nonexistent/tests"], USAGE, "/nonexistent/tests"),
    ("doctor-unknown-section", ["doctor", "--gpu", "--skip", "pytest,lint"], USAGE, "unknown section lint"),
    ("doctor-budget", ["doctor", "--gpu", "--budget-s", "0"], USAGE, "argument --budget-s: must be a finite number > 0, got 0"),
    ("doctor-out-is-a-folder", ["doctor", "--gpu", "--out", "{tmp}"], USAGE, "is a directory"),
    ("doctor-workers", ["doctor", "--gpu", "--pytest-workers", "-1"], USAGE, "argument --pytest-workers: must be >= 0, got -1"),
    # --- prepare
    ("prepare-local-without-path", ["prepare", "--source", "local"], USAGE, "needs --path"),
    ("prepare-download-protein-without-path", ["prepare", "--preset", "protein-llama", "--download"], USAGE,
     "give --path"),
    ("prepare-download-files-alone", ["prepare", "--download-files", "2"], USAGE, "give --download"),
    ("paper-score-dry-run", ["paper", "004-t1-nanogpt", "--dry-run"], USAGE, "--dry-run: options of `muonlab paper run`"),
    ("paper-run-mfu-without-dry-run", ["paper", "run", "004-t1-nanogpt", "--preset", "tied-cpu", "--mfu", "0.3"],
     USAGE, "give --dry-run"),
    ("prepare-download-files-zero", ["prepare", "--preset", "imagegpt", "--download", "--download-files", "0"],
     USAGE, "must be >= 1"),
    # --- issue 32: numbers checked where they are parsed, before anything is written
    ("nan-learning-rate", TINY + ["--matrix-lr", "nan"], USAGE, "(optim.matrix_lr) must be a finite number, got nan"),
    ("inf-learning-rate", TINY + ["--matrix-lr", "inf"], USAGE, "must be a finite number, got inf"),
    ("inf-time-budget", TINY + ["--num-steps", "none", "--time-budget", "inf"], USAGE, "(train.time_budget) must be a finite"),
    ("nan-time-budget", TINY + ["--num-steps", "none", "--time-budget", "nan"], USAGE, "(train.time_budget) must be a finite"),
    ("nan-grad-clip", TINY + ["--grad-clip", "nan"], USAGE, "(train.grad_clip) must be a finite number"),
    ("nan-max-loss", TINY + ["--max-loss", "nan"], USAGE, "(train.max_loss) must be a finite number"),
    ("negative-seed", TINY + ["--seed", "-1"], USAGE, "seed must be between 0 and 2**63 - 1, got -1"),
    ("sweep-seeds-empty-element", ["sweep", "--preset", "cpu-tiny", "--arms", "baseline", "--seeds", "1,,2"], USAGE,
     "has an empty element"),
    ("sweep-negative-seeds", ["sweep", "--preset", "cpu-tiny", "--arms", "baseline", "--seeds", "3,-1"], USAGE,
     "seeds must be >= 0, got -1"),
    ("sweep-arms-empty-element", ["sweep", "--preset", "cpu-tiny", "--arms", "baseline,", "--seeds", "1"], USAGE,
     "--arms 'baseline,' has an empty element"),
    ("sweep-single-seed", ["sweep", "--preset", "cpu-tiny", "--arms", "baseline", "--seed", "5"], USAGE, "not --seed"),
    ("sweep-dry-run-slurm-options-local", ["sweep", "--preset", "cpu-tiny", "--arms", "baseline", "--seeds", "1",
                                           "--slurm", "timeout_min=5", "--dry-run"], USAGE,
     "--slurm options are for --executor slurm"),
    # --- issue 32: options a verb or family does not read
    ("trajectory-steps-on-tied", TIED + ["--trajectory-steps", "0,10"], USAGE, "model family tied records no trajectory"),
    ("paper-score-with-run-options", ["paper", "004-t1-nanogpt", "--parallel", "2", "--retry-failed"], USAGE,
     "--parallel, --retry-failed: options of `muonlab paper run`, not of paper score"),
    ("paper-tables-with-settings", ["paper", "tables", "--depth", "3", "--threshold", "5"], USAGE,
     "takes no table or settings (--depth, --threshold)"),
    ("paper-tables-with-a-price-option", ["paper", "tables", "--gpu", "A100"], USAGE,
     "--gpu: options of `muonlab paper run`, not of paper tables"),
    ("config-empty-unknown-section", lambda t: ["train", "--config", str(_file(t, "c.json", json.dumps(
        {"config": {"format": 2, "family": "autoresearch", "seed": 1, "bogus_section": {}}})))], USAGE,
     "'bogus_section' is not a setting or a section"),
    ("config-not-whole", lambda t: ["train", "--config", str(_file(t, "c.json", json.dumps(
        {"config": {"format": 2, "family": "autoresearch", "seed": 1}})))], USAGE,
     "lacks the section(s) model, optim, schedule, train, runtime, data, record"),
    ("config-unknown-preset", lambda t: ["train", "--config", str(_file(t, "c.json", json.dumps(
        {"preset": "cpu-huge", "seed": 1})))], USAGE, "is not a preset"),
    # --- issue 32: a diagnostic reads a run of its family, refused before anything is built
    ("diagnose-afmuon-autoresearch-run", lambda t: ["diagnose", "afmuon", "--run", str(_trained(t, "cpu-tiny"))],
     USAGE, "diagnose afmuon reads an AF-Muon optimizer's tied-table state"),
    ("diagnose-geometry-tied-run", lambda t: ["diagnose", "geometry", "--run", str(_trained(t, "tied-cpu"))], USAGE,
     "diagnose geometry reads the autoresearch GPT's attention weights"),
    ("diagnose-audit-tied-run", lambda t: ["diagnose", "audit", "--run", str(_trained(t, "tied-cpu"))], USAGE,
     "diagnose audit reads the autoresearch GPT's tables"),
    ("diagnose-tied-autoresearch-run", lambda t: ["diagnose", "tied", "--run", str(_trained(t, "cpu-tiny"))], USAGE,
     "diagnose tied reads a tied token table"),
    ("diagnose-overhead-autoresearch-preset", ["diagnose", "overhead", "--preset", "cpu-tiny"], USAGE,
     "cpu-tiny is a preset of the autoresearch family"),
    ("diagnose-gauge-tied-preset", ["diagnose", "gauge", "--preset", "tied-cpu"], USAGE,
     "preset 'tied-cpu' builds a tied model"),
    # --- issue 32: nothing half-written by a refused command, and the right message
    ("prepare-corrupt-parquet", lambda t: ["prepare", "--source", "local", "--path",
                                           str(_file(t, "bad.parquet", "not parquet"))], RUNTIME,
     "corrupted parquet file"),
    ("prepare-jsonl-without-text", lambda t: ["prepare", "--source", "local", "--path",
                                              str(_file(t, "d.jsonl", '{"x": 1}\n'))], USAGE, "no string field 'text'"),
    ("prepare-empty-file", lambda t: ["prepare", "--source", "local", "--path", str(_file(t, "e.txt", ""))], USAGE,
     "no non-empty documents"),
    ("report-tsv-is-a-folder", lambda t: ["report", "--ledger", str(_ledger_with_a_run(t)), "--tsv", str(t / "in")],
     USAGE, "is a directory; give a file name"),
    ("report-ledger-is-a-folder", ["report", "--ledger", "{tmp}"], USAGE, "is a directory; give the ledger file"),
    ("train-ledger-is-a-folder", lambda t: TINY + ["--num-steps", "1", "--ledger", str(t / "in")], RUNTIME,
     "is a directory"),
    ("ledger-recover-nothing-there", ["ledger", "recover", "/nonexistent/runs"], USAGE, "is not a runs directory"),
    ("plugin-never-selected", lambda t: TINY + ["--num-steps", "1", "--plugin", str(_file(
        t, "contract_conditioner.py", CONDITIONER.replace("plugin_sign", "contract_sign")))], USAGE,
     "registers prepolar contract_sign, and this run selects none of them"),
    ("sweep-plugin-never-selected", lambda t: ["sweep", "--preset", "cpu-tiny", "--arms", "baseline", "--seeds", "1",
                                               "--plugin", str(_file(t, "sweep_conditioner.py", CONDITIONER.replace(
                                                   "plugin_sign", "contract_sweep_sign")))], USAGE,
     "no arm of this sweep selects any of them"),
    # a verb's own numbers are checked where parsed (settings.integer_at_least / finite_number)
    ("conditioning-negative-seed", ["diagnose", "conditioning", "--seed", "-1"], USAGE,
     "argument --seed: must be between 0 and"),
    ("storage-negative-seed", ["diagnose", "storage", "--seed", "-1"], USAGE, "argument --seed: must be between 0 and"),
    ("gauge-negative-seed", ["diagnose", "gauge", "--preset", "cpu-tiny", "--seed", "-7"], USAGE,
     "argument --seed: must be between 0 and"),
    ("overhead-vocab-zero", ["diagnose", "overhead", "--preset", "tied-cpu", "--vocab", "0"], USAGE,
     "argument --vocab: must be >= 1, got 0"),
    ("overhead-micro-steps-zero", ["diagnose", "overhead", "--preset", "tied-cpu", "--micro-steps", "0"], USAGE,
     "argument --micro-steps: must be >= 1, got 0"),
    ("report-threshold-nan", ["report", "--threshold", "nan"], USAGE, "argument --threshold: must be a finite number"),
    ("eval-negative-step", ["eval", "{tmp}", "--step", "-1"], USAGE, "argument --step: must be >= 0, got -1"),
    ("list-setting-empty-element", TINY + ["--trajectory-steps", "0,,10"], USAGE,
     "trajectory_steps '0,,10' has an empty element"),
    ("list-setting-negative-layer", TINY + ["--qk-scale", "head_temp", "--qk-freeze-layers", "0,-1"], USAGE,
     "qk_freeze_layers must be integers >= 0"),
    ("sinks-trailing-comma", TINY + ["--sinks", "tensorboard,"], USAGE, "sinks 'tensorboard,' has an empty element"),
    ("report-at-tokens-nan", ["report", "--at-tokens", "nan"], USAGE, "argument --at-tokens: must be a finite token"),
    ("plugin-without-a-value", ["config", "--preset", "cpu-tiny", "--plugin", "--"], USAGE,
     "--plugin: expected one argument"),
    ("preset-without-a-value", ["train", "--preset"], USAGE, "argument --preset: expected one argument"),
    ("flag-given-a-double-dash", ["diagnose", "accounting", "--visited-rows=--"], USAGE,
     "argument --visited-rows: expected one value, got '--'"),
    # where the run would be written: checked before its data is made
    ("run-name-escapes-the-runs-folder", TINY + ["--num-steps", "1", "--run-name", "../escape"], USAGE,
     "--run-name must be a plain directory name"),
    ("run-name-taken", lambda t: TINY + ["--num-steps", "1", "--runs-dir", str(_file(t, "runs/taken/x", "x").parents[1]),
                                        "--run-name", "taken"], USAGE, "already exists: give another --run-name"),
    ("runs-dir-under-a-file", lambda t: TINY + ["--num-steps", "1", "--runs-dir", str(_file(t, "f.txt", "x") / "runs")],
     RUNTIME, "cannot write the ledger's folder"),
    ("runs-dir-under-a-file-ledger-elsewhere", lambda t: TINY + [
        "--num-steps", "1", "--ledger", str(t / "in" / "ledger.jsonl"), "--runs-dir", str(_file(t, "g.txt", "x") / "runs")],
     RUNTIME, "cannot write the runs folder"),
    ("runs-dir-is-a-file", lambda t: TINY + ["--num-steps", "1", "--ledger", str(t / "in" / "ledger.jsonl"),
                                            "--runs-dir", str(_file(t, "runs.txt", "x"))],
     RUNTIME, "the runs folder"),
    ("sweep-ledger-is-a-folder", ["sweep", "--preset", "cpu-tiny", "--arms", "baseline", "--seeds", "1",
                                  "--ledger", "{tmp}"], RUNTIME, "is a directory; give the ledger file"),
    ("sweep-runs-dir-under-a-file", lambda t: ["sweep", "--preset", "cpu-tiny", "--arms", "baseline", "--seeds", "1",
                                               "--ledger", str(t / "in" / "ledger.jsonl"), "--runs-dir",
                                               str(_file(t, "h.txt", "x") / "runs")],
     RUNTIME, "cannot write the runs folder"),
    # SLURM missing or refusing: nothing submitted, and the sweep's job files are not left behind
    ("paper-run-slurm-without-slurm", ["paper", "run", "000-t1", "--preset", "cpu-tiny", "--executor", "slurm"],
     RUNTIME, "SLURM's sbatch is not on this machine's PATH: nothing was submitted"),
    ("paper-run-slurm-without-srun", ["paper", "run", "000-t1", "--preset", "cpu-tiny", "--executor", "slurm"],
     RUNTIME, "SLURM's srun is not on this machine's PATH: nothing was submitted"),
    ("paper-run-slurm-refuses-the-array", ["paper", "run", "000-t1", "--preset", "cpu-tiny", "--executor", "slurm"],
     RUNTIME, "SLURM refused the array, nothing was submitted: sbatch: error: Batch job submission failed"),
    ("paper-run-plugin-never-selected", lambda t: ["paper", "run", "000-t1", "--preset", "cpu-tiny", "--plugin", str(
        _file(t, "paper_conditioner.py", CONDITIONER.replace("plugin_sign", "contract_paper_sign")))], USAGE,
     "no arm of table 000-t1 selects any of them"),
    ("prefetch-batches-negative", TINY + ["--prefetch-batches", "-1"], USAGE,
     "--prefetch-batches (data.prefetch_batches) must be >= 0, got -1"),
    ("encode-processes-negative", TINY + ["--encode-processes", "-1"], USAGE,
     "--encode-processes (data.encode_processes) must be >= 0, got -1"),
    ("collectives-always-without-torchrun", TINY + ["--collectives", "always", "--num-steps", "1"], USAGE,
     "--collectives always runs the N-rank optimizer step in a torchrun world"),
    ("tied-vocab-rows-zero", TIED + ["--tied-vocab-rows", "0"], USAGE,
     "--tied-vocab-rows (model.vocab_rows) must be >= 1, got 0"),
    ("config-experiment-unknown-arm", lambda t: ["config", "--experiment", str(_study(t)), "--arm", "nope"], USAGE,
     "is not an arm of"),
    ("config-experiment-arm-name", lambda t: ["config", "--experiment", str(_study(t)), "--arm-name", "x",
                                              "--prepolar", "hbieq"], USAGE, "--experiment names its own arms"),
    ("config-experiment-other-preset", lambda t: ["config", "--experiment", str(_study(t)), "--preset", "gpu-d6"],
     USAGE, "runs preset cpu-tiny: drop --preset gpu-d6"),
    ("eval-every-with-step", ["eval", "{tmp}", "--every", "2", "--step", "2"], USAGE, "drop --step"),
    ("eval-every-not-a-run", ["eval", "{tmp}", "--every", "2"], USAGE, "is not a run directory"),
    ("eval-every-no-checkpoint", lambda t: ["eval", str(_trained(t, "cpu-tiny")), "--every", "1"], USAGE,
     "kept no checkpoint after a multiple of 1 steps before its end"),
    ("config-file-unreadable", ["train", "--config", "{tmp}"], USAGE, "cannot be read (IsADirectoryError)"),
    ("eval-plugin-changed", lambda t: ["eval", str(_run_of_a_changed_plugin(t))], USAGE,
     "changed since this run was configured: re-scoring it would run other code"),
    ("experiment-plugin-never-selected", lambda t: ["sweep", "--dry-run", "--experiment", str(_study(
        t, f'plugins = ["{_file(t, "exp_conditioner.py", CONDITIONER.replace("plugin_sign", "contract_exp_sign")).name}"]'))],
     USAGE, "registers prepolar contract_exp_sign, and no arm of the file selects any of them"),
]


def _argv(case_argv, tmp: Path) -> list[str]:
    argv = case_argv(tmp) if callable(case_argv) else case_argv
    return [str(tmp / "in") if a == "{tmp}" else a for a in argv]


def _files_under(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*") if p.is_file()} if folder.exists() else set()


RAISED: dict[str, set[tuple[str, int]]] = {}  # case id -> the UsageError sites it reached


def _drive(case_id, case_argv, tmp: Path, monkeypatch, capsys) -> tuple[int, str, str, set[Path]]:
    (tmp / "in").mkdir(parents=True, exist_ok=True)
    work, cache = tmp / "work", tmp / "cache"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("MUONLAB_CACHE", str(cache))
    monkeypatch.delenv("MUONLAB_DEBUG", raising=False)
    for name, value in CASE_ENV.get(case_id, {}).items():
        monkeypatch.setenv(name, value(tmp))
    argv = _argv(case_argv, tmp)
    inputs = _files_under(tmp / "in")
    sites: set[tuple[str, int]] = set()
    real_init = UsageError.__init__

    def recording_init(self, *args):
        caller = inspect.currentframe().f_back
        sites.add((str(Path(caller.f_code.co_filename).resolve()), caller.f_lineno))
        real_init(self, *args)

    monkeypatch.setattr(UsageError, "__init__", recording_init)
    code = main(argv)
    monkeypatch.setattr(UsageError, "__init__", real_init)
    RAISED[case_id] = sites
    out, err = capsys.readouterr()
    left = (_files_under(tmp) - inputs)
    return code, out, err, left


def _would_train_here(case_id: str) -> bool:
    return case_id.startswith("gpu-preset") and (torch.cuda.is_available() or torch.backends.mps.is_available())


@pytest.mark.parametrize("case_id,argv,code,needle", [pytest.param(*case, id=case[0]) for case in CASES])
def test_error_contract(case_id, argv, code, needle, tmp_path, monkeypatch, capsys, forget_plugins):
    if case_id == "device-unavailable" and torch.backends.mps.is_available():
        pytest.skip("MPS exists here")
    if _would_train_here(case_id):
        pytest.skip("a GPU exists here: the preset would train")
    got, out, err, left = _drive(case_id, argv, tmp_path, monkeypatch, capsys)
    message = err.strip()
    assert got == code, f"exit {got}, expected {code}: {message}"
    assert message.startswith("error:") and "\n" not in message, message
    assert needle in message, message
    assert "Traceback" not in out + err
    assert not left, f"files left behind: {sorted(map(str, left))}"


# The config layer: every `UsageError(` here must be reached by a case above.
CHECKED_MODULES = ["settings.py", "config/__init__.py", "config/run.py", "data/config.py", "record/config.py",
                   "record/sinks.py", "families/__init__.py", "families/autoresearch/config.py", "families/tied/afmuon.py",
                   "families/autoresearch/__init__.py", "families/tied/__init__.py", "optim/prepolar.py",
                   "optim/addons/moment_free.py", "optim/addons/neumann_whitening.py",
                   "model/variants/memory.py", "model/variants/over_encoding.py", "model/variants/qk_scale.py",
                   "arms.py", "plugins.py", "lab/experiment.py", "lab/sweep.py", "train/rescore.py", "lab/executors.py", "device.py",
                   "lab/request.py", "cli/parser.py", "cli/prepare.py", "cli/train.py", "cli/eval.py", "cli/run_flags.py",
                   "cli/sweep.py", "cli/paper.py", "cli/report.py", "cli/doctor.py", "cli/__init__.py", "diagnostics/runs.py",
                   "lab/plugin_methods.py", "lab/report/grouping.py"]
# Branches no case can reach on this machine, with the reason.
UNREACHABLE = {
    ("device.py", "CUDA is not available"): "only on a machine without CUDA (tested where that holds)",
    ("lab/executors.py", "visible GPU"): "needs GPUs to exceed",
    ("families/tied/afmuon.py", "runs in one process; under torchrun"): "needs torchrun (driven in "
                                                                 "tests/optim/test_af_muon_distributed.py)",
    ("lab/sweep.py", "share one ledger"): "arms of one preset share its ledger",
    ("plugins.py", "changed since this process imported it"): "needs a second command in one process "
                                                              "(tests/plugins/test_plugin_versions.py)",
    ("config/run.py", "device_batch_size x \""): "needs torchrun (tests/train/test_distributed_train.py)",
    # library entry points whose command-line twins are refused by the parser's choices first
    ("config/__init__.py", "unknown setting"): "flag names come from the parser (tests/config/test_config_structure.py)",
    ("config/__init__.py", "unknown preset"): "--preset has choices",
    ("lab/executors.py", "unknown executor"): "--executor has choices",
    ("lab/executors.py", "--gpus-per-run must be >= 1"): "--gpus-per-run's type refuses it first",
    ("lab/executors.py", "--parallel must be >= 1"): "--parallel's type refuses it first",
    ("lab/executors.py", "--gpus-per-run and --nodes must be >= 1"): "their types refuse them first",
    ("device.py", "precision must be one of"): "--precision has choices",
    ("data/config.py", "data source {self.source!r} is not one of"): "a Literal: settings.coerce refuses it first",
    ("data/config.py", "local_txt_docs {self.local_txt_docs!r} is not one of"): "a Literal: coerce refuses it first",
}


def _sites() -> dict[tuple[str, int], tuple[str, str]]:
    root = Path(muonlab.__file__).resolve().parent
    out = {}
    for module in CHECKED_MODULES:
        path = root / module
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\bUsageError\(", line) and not line.lstrip().startswith(("class ", "#", "except")):
                out[(str(path), lineno)] = (module, line.strip())
    return out


def test_every_validation_branch_is_driven(request, tmp_path_factory, monkeypatch, capsys, forget_plugins):
    missed = [case_id for case_id, *_ in CASES if case_id not in RAISED and not _would_train_here(case_id)]
    here, recorded = request.node.nodeid.split("::")[0], read_record()
    slow = [c for c in missed if f"{here}::test_error_contract[{c}]" in recorded]
    if slow:  # left out of this session by their tier (make test-fast): they train, and this test never does
        pytest.skip(f"{len(slow)} contract cases of a slower tier did not run in this session (make test runs them)")
    for case_id, argv, _, _ in CASES:  # cases not run in this session (e.g. under -k) run now
        if case_id in missed:
            with monkeypatch.context() as mp:
                _drive(case_id, argv, tmp_path_factory.mktemp(case_id), mp, capsys)
    reached = set().union(*RAISED.values())
    missing = []
    for site, (module, line) in _sites().items():
        if site in reached or any(module == m and text in line for m, text in UNREACHABLE):
            continue
        missing.append(f"{module}:{site[1]}: {line}")
    assert not missing, "validation branches no case drives:\n" + "\n".join(missing)


@pytest.mark.parametrize("argv, closest", [
    (["train", "--num-step", "5"], "--num-steps"),  # a partial flag sets nothing: argparse would take it
    (["train", "--prepolar-pas", "2"], "--prepolar-passes"),
    (["train", "--pres", "cpu-tiny"], "--preset"),  # the first pass (plug-ins, defaults) does not abbreviate either
    (["sweep", "--arm", "baseline"], "--arms"),
    (["diagnose", "conditioning", "--seedz", "3"], "--seeds"),
])
def test_a_flag_is_never_abbreviated_and_an_unknown_one_names_the_closest(argv, closest, capsys):
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: unknown option {argv[1 if argv[0] != 'diagnose' else 2]}") and closest in line
