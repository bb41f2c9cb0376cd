"""Seed 000 Table 4B (§4.4, seed 137) as printed: loss at steps 10 / 40 / 80, x0_lambdas[1] at 10 / 40 / 80 and
x0_lambdas[7] at 80, for `muonlab diagnose trajectory` to print beside its own."""

from __future__ import annotations

# Table 4B (seed 137): arm -> loss at 10, 40, 80; x0_lambdas[1] at 10, 40, 80; x0_lambdas[7] at 80
TRAJECTORY_STEPS = (10, 40, 80)
SEED000_TABLE4B = {
    "exp00_baseline": ((5.6835, 4.9576, 4.2519), (-2.141, -3.898, -2.875), -1.054),
    "exp58_zeta_bf16": ((6.0940, 5.1891, 4.5512), (-2.235, -5.420, -6.441), -5.293),
    "exp50_bieq_undamped_bf16": ((5.8629, 5.1004, 4.4210), (-2.275, -5.406, -6.401), -5.483),
    "exp44_hbieq_bf16": ((5.6829, 4.9088, 4.1519), (-2.156, -3.935, -3.058), -1.346),
}
TABLE4B_SEED = 137
