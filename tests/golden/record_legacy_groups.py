"""Record the optimizer groups an earlier release wrote into checkpoints, for tests/optim/test_legacy_group_keys.py.

Until the group keys became the settings' dotted keys below `optim.`, a method's group key was its flat flag with
underscores (`whiten_tau`, `prepolar`, `post_polar_dtype`). This script builds the optimizer of one config with every
method that writes group keys on, at values other than their defaults, and saves its `state_dict()["param_groups"]`
(what a checkpoint holds, read back with weights_only=True). It was run once, on the last release that wrote the
flat names (commit 6e2a25b):

    git worktree add /tmp/muonlab-6e2a25b 6e2a25b
    PYTHONPATH=/tmp/muonlab-6e2a25b/src python tests/golden/record_legacy_groups.py

Today's code writes other keys: run there, the script refuses to overwrite the recording.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from muonlab.arms import resolve_config
from muonlab.device import Runtime
from muonlab.train.build import build_model, build_optimizer

OUT = Path(__file__).with_name("legacy_group_keys.pt")
# every method that writes group keys, each at a value other than its default
SETTINGS = {"prepolar": "hbieq", "prepolar_tau": 25.0, "prepolar_passes": 1, "prepolar_sides": "row",
            "prepolar_scope": "square_only", "polar_dtype": "fp32", "post_polar_dtype": "fp32",
            "whiten": "neumann", "whiten_tau": 40.0, "whiten_terms": 2, "whiten_mean_addback": True,
            "table_whiten": "neumann", "table_whiten_tau": 30.0, "oe_m": 101, "homotopy_first_t": 0,
            "embedding_state": "master32"}


def optimizer():
    """The config's optimizer, as a run builds it."""
    torch.manual_seed(0)
    cfg = resolve_config("baseline", "cpu-tiny", SETTINGS)
    model = build_model(cfg, 300, Runtime(torch.device("cpu"), "fp32"))
    return build_optimizer(model, cfg, compile_step=False)


def param_groups():
    """The groups of the config's optimizer as its state_dict records them."""
    return optimizer().state_dict()["param_groups"]


def main() -> int:
    groups = param_groups()
    if any("." in key for group in groups for key in group):
        print("this release writes the dotted group keys: the recording is the earlier release's, kept", file=sys.stderr)
        return 1
    torch.save(groups, OUT)
    print(f"wrote {OUT} ({len(groups)} groups)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
