"""The values the seed papers print for the checkpoint audits and early trajectories, transcribed from
the papers, for the across-run diagnostics to print beside their own means.

- Seed 002 Table 4 (§4.2.1, 3-seed means at step 953): per depth and arm, wte / lm_head / OE-table
  stable rank with its mean-row energy share in %, and value-embedding, attention and MLP stable ranks.
- Seed 002 Table 5a (§4.2.2): exp(q_tau) per depth, seed and arm: mean, SD, high / mid / low band,
  layer 0, middle layers, final layer.
- Seed 000 Table 4B (§4.4, seed 137): loss at steps 10 / 40 / 80, x0_lambdas[1] at 10 / 40 / 80 and
  x0_lambdas[7] at 80.
"""

from __future__ import annotations

# the paper's row ids -> the registered arms
SEED002_ARMS = {"00": "00_dense_native", "01": "01_dense_opt", "02": "02_dense_joint", "10": "10_oe_native",
                "11": "11_oe_opt", "12": "12_oe_joint"}


def _t4(rows: dict) -> dict:
    out = {}
    for row, (wte, wte_e, head, head_e, oe, oe_e, ve, attn, mlp) in rows.items():
        out[SEED002_ARMS[row]] = {"wte": (wte, wte_e), "lm_head": (head, head_e),
                                  "oe_tables": None if oe is None else (oe, oe_e),
                                  "value_embeds": (ve, None), "attention": (attn, None), "mlp": (mlp, None)}
    return out


# Table 4: srank (mean-row %) for wte, lm_head, OE; srank for value embeddings, attention, MLP
SEED002_TABLE4 = {
    6: _t4({"00": (10.50, 8.12, 7.39, 11.94, None, None, 81.21, 61.19, 104.15),
            "01": (10.37, 8.35, 7.84, 11.31, None, None, 84.25, 61.63, 96.41),
            "02": (10.72, 7.99, 7.71, 11.49, None, None, 88.14, 63.20, 95.82),
            "10": (11.01, 6.37, 7.39, 11.83, 46.91, 0.43, 74.88, 58.52, 91.33),
            "11": (10.78, 6.78, 7.79, 11.28, 46.89, 0.43, 77.31, 57.83, 83.93),
            "12": (11.23, 6.28, 7.74, 11.32, 46.91, 0.40, 80.55, 58.14, 84.92)}),
    8: _t4({"00": (10.96, 7.80, 9.12, 9.60, None, None, 90.37, 79.51, 133.63),
            "01": (10.53, 8.22, 9.67, 9.11, None, None, 93.87, 79.09, 121.11),
            "02": (10.97, 7.82, 9.55, 9.22, None, None, 96.93, 81.22, 122.23),
            "10": (11.42, 6.61, 9.18, 9.43, 55.84, 0.36, 85.21, 73.47, 117.78),
            "11": (11.06, 6.59, 9.79, 8.89, 56.17, 0.33, 88.83, 74.12, 108.94),
            "12": (11.86, 5.99, 9.62, 9.03, 56.32, 0.32, 90.59, 74.75, 108.81)}),
}
TABLE4_FAMILIES = ("wte", "lm_head", "oe_tables", "value_embeds", "attention", "mlp")

# Table 5a: (depth, seed, arm) -> mean, sd, high, mid, low, layer 0, middle layers, final layer
QTAU_COLUMNS = ("mean", "sd", "high", "mid", "low", "layer0", "middle", "final")
SEED002_TABLE5A = {
    (6, 41, "02"): (1.4581, 0.6341, 1.2920, 1.5861, 1.3682, 1.4721, 1.5477, 1.3982),
    (6, 41, "12"): (1.3659, 0.7060, 1.1084, 1.5593, 1.2366, 1.1135, 1.5628, 1.2430),
    (6, 47, "02"): (1.4589, 0.5818, 1.3944, 1.5663, 1.3085, 1.4568, 1.5147, 1.4890),
    (6, 47, "12"): (1.3563, 0.6695, 1.1187, 1.5282, 1.2503, 1.1873, 1.5172, 1.2195),
    (8, 41, "02"): (1.4912, 0.6411, 1.3057, 1.5776, 1.5040, 1.5585, 1.5212, 1.3970),
    (8, 41, "12"): (1.3687, 0.6827, 1.0199, 1.5220, 1.4108, 1.2253, 1.4856, 1.1567),
    (8, 47, "02"): (1.5258, 0.5852, 1.4304, 1.6100, 1.4529, 1.4601, 1.5773, 1.3929),
    (8, 47, "12"): (1.3636, 0.6516, 1.1293, 1.4912, 1.3428, 1.2174, 1.4469, 1.2124),
}
TABLE5A = {(depth, seed, SEED002_ARMS[row]): dict(zip(QTAU_COLUMNS, values))
           for (depth, seed, row), values in SEED002_TABLE5A.items()}
EXCESS_PAIR = ("12_oe_joint", "02_dense_joint")  # Table 5a's "excess": OE joint against dense joint

# Table 4B (seed 137): arm -> loss at 10, 40, 80; x0_lambdas[1] at 10, 40, 80; x0_lambdas[7] at 80
TRAJECTORY_STEPS = (10, 40, 80)
SEED000_TABLE4B = {
    "exp00_baseline": ((5.6835, 4.9576, 4.2519), (-2.141, -3.898, -2.875), -1.054),
    "exp58_zeta_bf16": ((6.0940, 5.1891, 4.5512), (-2.235, -5.420, -6.441), -5.293),
    "exp50_bieq_undamped_bf16": ((5.8629, 5.1004, 4.4210), (-2.275, -5.406, -6.401), -5.483),
    "exp44_hbieq_bf16": ((5.6829, 4.9088, 4.1519), (-2.156, -3.935, -3.058), -1.346),
}
TABLE4B_SEED = 137
