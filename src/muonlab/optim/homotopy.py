"""The homotopy ramp a_t = min(t / tau, 1)^2 (seed 000 §3.3), shared by the add-ons that use it
(HBiEq's alpha_t, the Neumann-Gram beta_t of seed 002 §1.4d and §1.11)."""


def homotopy_alpha(t: float, tau: float) -> float:
    """a_t = min(t / tau, 1)^2; tau = 0 means undamped (a = 1)."""
    return 1.0 if tau <= 0 else min(t / tau, 1.0) ** 2
