"""The homotopy ramp a_t = min(t / tau, 1)^2 (seed 000 §3.3) and its step index, shared by every
add-on that ramps (HBiEq's alpha_t, seed 002 §2.1 (Tier 1); the Neumann-Gram beta_t of §2.1 (Tier 1) on the
vocabulary tables and of §4.3 item 1 on the Over-Encoding tables).

Step index: one convention for all three. t = the number of the update, t = 1 at the first
(`HOMOTOPY_FIRST_T`). The papers state a counter only once, and it is this one: seed 000 §1
("at Step 0 (t=1)", for Zeta's bias-corrected moment), which is also the step counter of the
fused AdamW step that seed 002 runs Neumann-Gram inside. BiEq's index is unstated
(seed 000 §3.3 gives only min(t/80, 1)^2). `--homotopy-first-t 0` starts every ramp at t = 0 instead (a_0 = 0: the
first update equals the baseline's up to rounding). Either way the ramp's state is the owning
optimizer's own counter of completed updates, so checkpoints carry it.
"""

HOMOTOPY_FIRST_T = 1


def homotopy_t(completed_updates: int, first_t: int = HOMOTOPY_FIRST_T) -> int:
    """The t of the update that follows `completed_updates` updates (never negative)."""
    return max(completed_updates + first_t, 0)


def homotopy_alpha(t: float, tau: float) -> float:
    """a_t = min(t / tau, 1)^2; tau = 0 means undamped (a = 1)."""
    return 1.0 if tau <= 0 else min(t / tau, 1.0) ** 2
