"""What the GPU acceptance check's compiled-against-eager test (tests/doctor/test_gpu_acceptance.py)
covers: one arm for every registered method, every arm group and every model family (a family
no arm runs under: its baseline), each at its model family's smallest preset.

It is derived from the registries (muonlab.arms.ARMS, the method catalogue of
muonlab.lab.methods, the model families), so a new method or family is checked without an edit here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The compile check's runtime: the GPU training path (bf16 autocast, torch.compile of the model and
# of the optimizer step), quiet.
CUDA_OVERRIDES: dict[str, Any] = {"runtime.device": "cuda", "runtime.precision": "bf16",
                                  "runtime.compile": "on", "record.quiet": True}
# Overrides that change a model's shape: an arm that sets one compiles a bigger graph, so the
# selection prefers another arm covering the same methods.
_SHAPE_KEYS = ("model.depth", "model.n_embd", "model.aspect_ratio", "model.head_dim", "model.preset")
# Overrides of the batch or the context (seed 004's K.5 batch sweep, Table 25's pilot): such an arm would run
# the check at the paper's batch, so it is not picked; a family only such arms run under gets its baseline.
_BATCH_KEYS = ("train.sequence_len", "train.device_batch_size", "train.total_batch_size")


def small_preset(family: str) -> str:
    """The model family's smallest preset (fewest tokens per micro-step, then name): the shape the
    compile check trains at."""
    from muonlab.config import all_presets, preset  # noqa: PLC0415

    names = sorted(n for n, v in all_presets().items() if v["family"] == family)
    if not names:
        raise ValueError(f"model family {family!r} has no preset")
    return min(names, key=lambda n: (preset(n).train.tokens_per_micro_step, n))


@dataclass(frozen=True)
class ArmCase:
    """One arm of the compile check: the preset it runs at and the coverage keys it stands for."""

    arm: str
    model_family: str
    preset: str
    covers: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"arm": self.arm, "model_family": self.model_family, "preset": self.preset,
                "covers": list(self.covers)}


def _keys_by_arm() -> dict[str, set[str]]:
    """arm -> the keys it covers: `method:<name>` for every registered method it switches on,
    `group:<arm group>` (muonlab.arms.Arm.group) and `model:<model family>`."""
    from muonlab.arms import ARMS  # noqa: PLC0415
    from muonlab.lab.methods import method_catalog  # noqa: PLC0415

    keys = {name: {f"group:{arm.group}", f"model:{arm_model_family(arm)}"} for name, arm in ARMS.items()}
    for entry in method_catalog():
        for name in entry["arms"]:
            keys[name].add(f"method:{entry['name']}")
    return keys


def arm_model_family(arm) -> str:
    """The family an arm is checked under: its own, else the first it runs under (seed 004's Table-1
    arms: tied), else autoresearch."""
    return arm.overrides.get("family") or (arm.model_families[0] if arm.model_families else "autoresearch")


def uncovered_methods() -> list[str]:
    """Registered methods no arm switches on: the compile check cannot reach them."""
    from muonlab.lab.methods import method_catalog  # noqa: PLC0415

    return sorted(e["name"] for e in method_catalog() if not e["arms"])


def representative_arms() -> list[ArmCase]:
    """The baseline, then a greedy cover of every key of _keys_by_arm: each pick covers the most
    keys not yet covered (an arm that changes the model's shape counts as half a pick; ties by
    name). Deterministic."""
    from muonlab.arms import ARMS  # noqa: PLC0415

    keys = _keys_by_arm()
    chosen = ["baseline"]
    left = set().union(*keys.values()) - keys["baseline"]

    def score(name: str) -> tuple[float, str]:
        shaped = any(k in ARMS[name].overrides for k in _SHAPE_KEYS)
        gain = len(keys[name] & left)
        return (-(gain / 2 if shaped else gain), name)

    candidates = [n for n in keys if not any(k in ARMS[n].overrides for k in _BATCH_KEYS)]
    while left:
        best = min((n for n in candidates if n not in chosen), key=score)
        if not keys[best] & left:
            break  # unreachable: every key comes from some arm
        chosen.append(best)
        left -= keys[best]
    presets: dict[str, str] = {}
    cases = []
    for name in chosen:
        family = arm_model_family(ARMS[name])
        presets.setdefault(family, small_preset(family))
        cases.append(ArmCase(name, family, presets[family], tuple(sorted(keys[name]))))
    # a model family no arm runs under (seed 004's hf and imagegpt families): its own baseline
    from muonlab.families import FAMILIES  # noqa: PLC0415

    for family in sorted(set(FAMILIES) - set(presets)):
        cases.append(ArmCase("baseline", family, small_preset(family), (f"model:{family}",)))
    return cases
