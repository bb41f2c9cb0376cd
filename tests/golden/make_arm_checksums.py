"""Record (or recompute) every registered arm's parameter checksum after a few training steps.

The guard of the structure refactor (issue 12): moving code must not move numbers. For each arm,
a run of `STEPS` optimizer steps under its CPU preset (`tied-cpu` for the tied-token family,
`cpu-tiny` otherwise) is trained in this process and the final weights are hashed tensor by
tensor. The digest is over the sorted (dtype, shape, sha256) triples, so a parameter that is only
renamed or moved to another module keeps the digest, while any changed bit changes it.

Bitwise results depend on the machine: CPU kernels (AVX2, AVX-512, MKL's per-vendor paths) round
differently, and AdamW turns a rounding-noise gradient into a full step (x0_lambdas at step 0 is
mathematically zero), so another CPU gives other weights after 3 steps. The golden file therefore
holds one set of checksums per machine fingerprint (torch version, CPU capability, CPU model and
flags). To guard a refactor on a new machine, record that machine's set from the commit before the
refactor (c0660f1, the recording commit) and copy it in:

    git worktree add /tmp/pre-refactor c0660f1 && (cd /tmp/pre-refactor && \
        ../path/to/.venv/bin/python tests/golden/make_arm_checksums.py) # writes its own golden file
    python tests/golden/make_arm_checksums.py --merge /tmp/pre-refactor/tests/golden/arm_checksums.json

The AMD EPYC (AVX2) set was recorded again at f8c7999, which forms Polar Express's bf16 products
in fp32 on CPUs without native bf16 units (an intended numeric change, issue 13): 34 arms moved,
the 54 that run no bf16 Polar Express on CPU (fp32 iterations, AdamW, AF-Muon) kept their bits.
It was recorded again when the autoresearch GPT's loss became the fused, chunked soft-capped
cross-entropy (`model.head_loss=fused`, issue 14; the same loss, summed in another order): the 55
autoresearch-family arms moved, the 33 tied-family and AF-Muon arms kept their bits. Issue 46 gave AF-Muon's
Newton-Schulz the same fp32-formed bf16 products (a seed-004 CPU run's orthogonalisation was 28x slower in torch's
bf16 matmul there): the 84 seed-004 arms moved on the AMD EPYC (AVX2, b171f03701b7), recorded before and after.

    python tests/golden/make_arm_checksums.py            # record this machine's set (others kept)
    python tests/golden/make_arm_checksums.py --check    # compare, print the arms that differ

An intended numeric change is recorded on this machine for the arms it moves, and the other machines'
entries for those arms become stale (kept under "stale" with the reason, compared there only as "the
weights change" until that machine records them):

    python tests/golden/make_arm_checksums.py --arms A,B,... --reason "what moved them (commit/issue)"

Issue 16 (faithful defaults) moved 30 arms this way: the homotopy step index t = 1 at the first update
for BiEq (26 arms with prepolar hbieq, incl. every seed-002 opt arm), Neumann-Gram's fp32 output fed
unrounded to master32's fp32 moments, and ordinary autograd through the radius gates' statistics
(p003_state_gate, p003_branch_gate).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import os
import platform
import sys
import tempfile
from pathlib import Path

import torch

GOLDEN = Path(__file__).with_name("arm_checksums.json")
STEPS = 3


def machine_fingerprint() -> tuple[str, str]:
    """(fingerprint, description) of what decides the bits: torch, its CPU kernels, the CPU."""
    model, flags, vendor = platform.processor(), "", ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key, value = key.strip(), value.strip()
            if key == "model name" and not flags:
                model = value
            elif key == "vendor_id" and not vendor:
                vendor = value
            elif key == "flags" and not flags:
                flags = value
    except OSError:
        pass
    description = f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, {vendor} {model}".strip()
    digest = hashlib.sha256(f"{description}|{flags}".encode()).hexdigest()[:12]
    return digest, description


def tensor_digest(t: torch.Tensor) -> str:
    t = t.detach().cpu().contiguous()
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"").hexdigest()


def weights_digest(state: dict[str, torch.Tensor]) -> tuple[str, dict[str, str]]:
    full = {name: f"{str(t.dtype).removeprefix('torch.')}|{tuple(t.shape)}|{tensor_digest(t)}"
            for name, t in state.items()}
    blob = "\n".join(sorted(full.values()))
    # per tensor, the first 12 hex digits are kept: enough to say which tensor moved
    return hashlib.sha256(blob.encode()).hexdigest(), {name: v[:v.rindex("|") + 13] for name, v in full.items()}


def preset_for(arm) -> str:
    family = arm.overrides.get("family", arm.overrides.get("model_family"))  # format 2 or 1 arm keys
    if arm.name == "t15_untied_hybrid" or family == "t5":
        return "t5-cpu"
    if family == "reuse":
        return "reuse-cpu"
    if family == "hf":
        return "protein-cpu"
    return "tied-cpu" if family == "tied" or arm.paper == "seed 004" else "cpu-tiny"


def preset_batch(preset_name: str, arm_name: str | None = None) -> dict:
    """What the check holds at the CPU preset's values: its rows, context and global batch (seed 004's K.5
    batch sweep sets T 1024 and up to 512 sequences a step) and, where the arm sets them, its vocabulary
    (K.2's 50k-150k BPE cannot be trained on the CPU corpus) and tied width (K.4's d up to 1536, orthogonalised
    in bf16 on a CPU): such arms are checked at the CPU preset's, like their steps."""
    from muonlab.arms import get_arm
    from muonlab.config import preset

    p = preset(preset_name)
    held = {"sequence_len": p.train.sequence_len, "device_batch_size": p.train.device_batch_size,
            "total_batch_size": p.train.total_batch_size}
    overrides = get_arm(arm_name).overrides if arm_name else {}
    if "data.vocab_size" in overrides:
        held["vocab_size"] = p.data.vocab_size
    if "model.n_embd" in overrides and overrides.get("family") == "tied":
        held["tied_n_embd"] = p.model.n_embd
    if overrides.get("family", p.family) == "autoresearch":  # no trajectory records (the only family with them)
        held["trajectory_steps"] = ""
    return held


class RememberedEncodings:
    """A prepared corpus's tokenizer that encodes each document once for the whole check: every arm of a preset
    packs the same documents (the packer's 1,000-document buffer), so the same ids in a fraction of the time."""

    def __init__(self, tokenizer):
        self._tokenizer, self._ids = tokenizer, {}

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)

    def encode_batch(self, texts: list[str], prepend_bos: bool = True, **kwargs) -> list[list[int]]:
        missing = [t for t in dict.fromkeys(texts) if (t, prepend_bos) not in self._ids]
        for text, ids in zip(missing, self._tokenizer.encode_batch(missing, prepend_bos=prepend_bos, **kwargs)):
            self._ids[(text, prepend_bos)] = ids
        return [list(self._ids[(t, prepend_bos)]) for t in texts]


def prepared(cfg, log) -> object:
    """The family's prepared data, its tokenizer (where it has one) remembering its encodings."""
    from muonlab.families import get_family

    data = get_family(cfg.family).prepare_data(cfg, log=log)
    if hasattr(getattr(data, "tokenizer", None), "encode_batch"):
        data.tokenizer = RememberedEncodings(data.tokenizer)
    return data


def arm_checksum(arm_name: str, preset_name: str, runs_dir: Path, data_cache: dict) -> tuple[str, dict[str, str]]:
    """Train `arm_name` for STEPS steps under `preset_name` in this process; hash its final weights."""
    from muonlab.arms import resolve_config
    from muonlab.train import run_training

    cfg = resolve_config(arm_name, preset_name, {"num_steps": STEPS, "quiet": True, "runs_dir": str(runs_dir),
                                                 **preset_batch(preset_name, arm_name)})
    assert cfg.config_hash() == checked_config(arm_name).config_hash()  # the record keys do not act
    if preset_name not in data_cache:
        data_cache[preset_name] = prepared(cfg, log=lambda _: None)
    result = run_training(cfg, log=lambda _: None, data=data_cache[preset_name])
    state = torch.load(result.run_dir / "model.pt", weights_only=True)
    return weights_digest(state)


def recording_threads() -> int:
    """The thread count every set is recorded (and checked) with: kernels split sums by thread."""
    return min(2, os.cpu_count() or 1)


def checked_config(arm_name: str):
    """The config an arm is checked with: its CPU preset, STEPS steps, the held settings."""
    from muonlab.arms import get_arm, resolve_config

    preset_name = preset_for(get_arm(arm_name))
    return resolve_config(arm_name, preset_name, {"num_steps": STEPS,
                                                  **preset_batch(preset_name, arm_name)})


def arm_groups(arm_names) -> dict[str, list[str]]:
    """Arms whose checked configs have one hash (every setting that can change a number), under the
    first of them by name: e.g. K.5's batch arms at the CPU preset's batch are t1's config. One run
    per group gives every member's weights (the run is deterministic given its config)."""
    return {first: list(members) for first, members in _arm_groups(tuple(sorted(arm_names))).items()}


@functools.cache  # the checksum and float64 tests group the same arms in one process (149 configs, ~2 s)
def _arm_groups(arm_names: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    groups: dict[str, list[str]] = {}
    by_hash: dict[str, str] = {}
    for name in arm_names:
        first = by_hash.setdefault(checked_config(name).config_hash(), name)
        groups.setdefault(first, []).append(name)
    return {first: tuple(members) for first, members in groups.items()}


# The float settings whose value no code branches on: each only multiplies or is added (a value's sign and the values
# 0, 1 and the non-finite ones are kept apart all the same). A setting not listed keeps its values apart: AF-Muon's
# cap, for one, is a switch (lmo.py: below sqrt(d) the Newton clamp runs, with data-dependent iterations and exact
# fallback rows; at or above it, the row scaling alone).
ARITHMETIC_FLOATS = {
    "optim.scale": "AF-Muon's s: a factor of the tied table's rate (eq. 6)",
    "optim.rho": "AF-Muon's rho: a factor of the tied table's rate (eq. 6)",
    "optim.vector_lr": "a learning rate: a factor of the vector groups' steps",
    "optim.adamw_lr": "a learning rate: a factor of the AdamW groups' steps",
    "model.routing.eps": "added to the shared denominator inside its rsqrt",
}


def code_path_groups(arm_names) -> dict[str, list[str]]:
    """Config groups (`arm_groups`) whose checked configs differ only in the value of settings in ARITHMETIC_FLOATS
    (one code path at another value), under the first of them by name. A value's sign and the values 0, 1 and the
    non-finite ones are kept apart, as code may branch on them (a zero rate skips its term, a multiplier of 1 may be
    skipped). The arm tests train one config group per code path; the recorder (`compute_all`) still trains every
    config group."""
    return {first: list(members) for first, members in _code_path_groups(tuple(sorted(arm_names))).items()}


@functools.cache
def _code_path_groups(arm_names: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    by_path: dict[str, list[str]] = {}
    for first, members in _arm_groups(arm_names).items():
        by_path.setdefault(code_path(checked_config(first).hashed_values()), []).extend(members)
    return {members[0]: tuple(members) for members in by_path.values()}


def code_path(values: dict) -> str:
    """The settings with each ARITHMETIC_FLOATS value other than 0, 1 or a non-finite one replaced by its sign."""

    def kind(key, value):
        if key in ARITHMETIC_FLOATS and isinstance(value, float) and math.isfinite(value) and value not in (0.0, 1.0):
            return "float > 0" if value > 0 else "float < 0"
        return value

    return json.dumps({key: kind(key, value) for key, value in values.items()}, sort_keys=True, default=str)


def compute_all(arm_names=None) -> dict[str, dict]:
    from muonlab.arms import ARMS

    torch.set_num_threads(recording_threads())
    out, cache = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("MUONLAB_CACHE", str(Path(tmp) / "cache"))
        for first, members in arm_groups(arm_names or ARMS).items():
            preset_name = preset_for(ARMS[first])
            digest, per_name = arm_checksum(first, preset_name, Path(tmp) / "runs", cache)
            for name in members:
                out[name] = {"preset": preset_name, "steps": STEPS, "digest": digest, "tensors": per_name}
    return out


def record_arms(golden: dict, names: list[str], reason: str | None) -> int:
    """Record `names` (and arms new to the registry, which join their config group or are trained) on
    this machine; on every other machine the moved arms go to "stale" and a new arm takes its config
    group's recorded entry (one config: one set of weights)."""
    from muonlab.arms import ARMS

    fingerprint, description = machine_fingerprint()
    mine = golden["machines"].setdefault(fingerprint, {"machine": description, "arms": {}})
    unknown = sorted(set(names) - set(ARMS))
    if unknown:
        raise SystemExit(f"not registered arms: {', '.join(unknown)}")
    if reason is None and any(n in mine["arms"] for n in names):
        raise SystemExit("recording arms already in the golden file is a numeric change: say why with --reason")
    new = sorted(set(ARMS) - set(mine["arms"]) - set(names))
    current = compute_all(sorted(set(names) | set(new)))
    for name, entry in current.items():
        mine["arms"][name] = entry
        mine.get("stale", {}).pop(name, None)
    if not mine.get("stale"):
        mine.pop("stale", None)
    groups = arm_groups(ARMS)
    group_of = {m: first for first, members in groups.items() for m in members}
    for key, other in golden["machines"].items():
        if key == fingerprint:
            continue
        for name in names:
            if name in other["arms"]:
                other.setdefault("stale", {})[name] = reason
                del other["arms"][name]
        for name in new:
            mates = [m for m in groups[group_of[name]] if m in other["arms"]]
            if mates:
                other["arms"][name] = other["arms"][mates[0]]
            else:
                other.setdefault("stale", {})[name] = "new arm: not yet recorded on this machine"
    GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    print(f"recorded {len(current)} arms for {description} ({fingerprint}); "
          f"{sum(len(o.get('stale', {})) for o in golden['machines'].values())} stale entries elsewhere")
    return 0


def load_golden(path: Path = GOLDEN) -> dict:
    return json.loads(path.read_text()) if path.exists() else {"machines": {}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the golden file instead of writing it")
    parser.add_argument("--merge", metavar="FILE", help="copy the machine sets of another golden file into this one")
    parser.add_argument("--arms", help="record only these arms (comma-separated) in this machine's set; with "
                                       "--reason the other machines' entries of them become stale")
    parser.add_argument("--reason", help="why the --arms moved (an intended numeric change)")
    args = parser.parse_args()
    golden = load_golden()
    if args.arms:
        return record_arms(golden, args.arms.split(","), args.reason)
    if args.merge:
        golden["machines"].update(json.loads(Path(args.merge).read_text())["machines"])
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
        print(f"{len(golden['machines'])} machine sets in {GOLDEN}")
        return 0
    fingerprint, description = machine_fingerprint()
    current = compute_all()
    if args.check:
        arms = golden["machines"][fingerprint]["arms"]
        bad = sorted(n for n in arms if current.get(n, {}).get("digest") != arms[n]["digest"])
        print("all arms match" if not bad else "differ: " + ", ".join(bad))
        return 1 if bad else 0
    golden["machines"][fingerprint] = {"machine": description, "arms": current}
    GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(current)} arms for {description} ({fingerprint}) to {GOLDEN}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
