"""Seed 003's arms: backward branch-credit rules and forward radius gates (Tables 1-2), registered through
muonlab.arms.register as a plug-in's are."""

from __future__ import annotations

from muonlab.arms import Arm, register


# Seed 003 (docs/papers.md), Tables 1–2: backward branch-credit rules at every
# residual addition (seeds 46 exploratory, 146 and 246 replications) and forward radius gates
# (seed 246), the gate arms on the paper's memory-safe path (block checkpointing, 4096-token loss chunks).
_GATE = dict(checkpoint_blocks=True, loss_chunk_tokens=4096)
for _name, _seeds, _overrides, _what in [
    ("p003_ordinary", (46, 146, 246), {}, "ordinary backward (the control)"),
    ("p003_branch_tangent", (46, 146, 246), dict(residual_rule="branch_tangent"),
     "branch cotangent projected off the residual state y"),
    ("p003_whole_state_tangent", (46,), dict(residual_rule="whole_state_tangent"), "both cotangents projected"),
    ("p003_grad_mag_control", (46,), dict(residual_rule="grad_mag_control"),
     "matched projected-gradient-magnitude control"),
    ("p003_state_gate", (246,), dict(_GATE, radius_gate="state"), "forward radius gate on the incoming state"),
    ("p003_branch_gate", (246,), dict(_GATE, radius_gate="branch"), "forward radius gate on the branch output"),
    ("p003_neutral_gate", (246,), dict(_GATE, radius_gate="neutral"), "the gate code with its scalars frozen at 0"),
]:
    register(Arm(name=_name, description=f"seed 003: {_what}", overrides=_overrides, paper="seed 003",
                 experiment=_name.removeprefix("p003_"), group="seed003", seeds=_seeds))
