"""Seed 004's printed tied-table diagnostics that a run's record does not hold, as the paper prints them.

The columns every tied run records (the tied table's RMS and largest entry, the hidden matrices' RMS, the
MoE's router statistics) are paper tables of this pack (tables.json: 004-t3-*, -t5-, -t7-,
-t9-, -t11-, -t13-, -t19-, -t22-, -t36-, -t37-*), scored against a ledger by `muonlab paper score`. This
module holds the rest, each printed beside its measurement by the diagnose tool that measures it, when the
run's model preset is the table's:

- Table 13 (Llama-3.2-1B, long-horizon seed-43 continuation to 9.98B tokens, preset llama-3.2-1b): the
  gradient norm per optimizer. `muonlab diagnose tied` measures the norm of the run's next step's mean
  gradient (before any clip); the run logs it per step in metrics.jsonl, not in its summary.
- Table 22 (tied ImageGPT on ImageNet-32, preset imagegpt; mean ± SD over seeds 43-45): the fraction of rows
  clipped, the row-RMS tail energy, cos(AF, Sign) and the objective ratio AF / Sign, for Sign and AF-Muon
  (Hybrid's tied table is on AdamW: no LMO, the paper prints "–"). `muonlab diagnose afmuon`.
- Table 37 (NanoGPT cap c x scale s sweep at 393.2M tokens, preset nanogpt-124m; mean ± SD over 3 seeds):
  coordinates capped, rows clipped, tail energy, cos(AF, Sign), objective ratio per (c, s).
  `muonlab diagnose afmuon` at the run's (c, s). (Its matrix-RMS column is the paper table 004-t37-matrix-rms.)
- Not measured (`SETTINGS`): the weight-decay and precision columns of Tables 3, 5, 7, 9, 11 and 13.

Values are (mean, SD) where the paper prints mean ± SD, else the printed number.
"""

from __future__ import annotations

import math

INF = math.inf

# Table 13: final Llama-3.2-1B long-horizon seed-43 diagnostics, "Grad norm", by optimizer
TABLE13_MODEL = "llama-3.2-1b"
TABLE13_SOURCE = "Table 13: Llama-3.2-1B long-horizon seed 43, final (9.98B tokens)"
TABLE13_GRAD_NORM = {"hybrid": 0.3709, "sign": 0.3029, "afmuon": 0.3084}

# Table 22: tied ImageGPT, ImageNet-32, final tied-table diagnostics (mean, SD over three paired seeds)
TABLE22_MODEL = "imagegpt"
TABLE22_SOURCE = "Table 22: tied ImageGPT (ImageNet-32), final, mean ± SD over seeds 43-45"
TABLE22 = {
    "sign": {"rows_clipped": (1.000, 0.000), "tail_energy": (0.8012, 0.0005)},  # cos and ratio: "–"
    "afmuon": {"rows_clipped": (0.773, 0.015), "tail_energy": (0.0350, 0.0013), "cos_sign": (0.799, 0.001),
               "objective_ratio": (1.251, 0.000)},
}

# Table 37: NanoGPT cap / scale sweep at 393.2M tokens (step 750), mean, SD over three matched seeds
TABLE37_MODEL = "nanogpt-124m"
TABLE37_SOURCE = "Table 37: NanoGPT cap / scale sweep at 393.2M tokens (step 750), mean ± SD over 3 seeds"
TABLE37_KEYS = ("coord_capped", "rows_clipped", "tail_energy", "cos_sign", "objective_ratio")
_TABLE37_ROWS = (  # c, s, then the columns of TABLE37_KEYS, as the rows print
    (1, 0.5, (1.0000, 0.0000), (1.0000, 0.0000), (0.8005, 0.0002), (1.000, 0.000), (1.000, 0.000)),
    (2, 0.5, (0.0579, 0.0000), (1.0000, 0.0000), (0.2723, 0.0021), (0.818, 0.000), (1.246, 0.000)),
    (3, 0.5, (0.0028, 0.0001), (0.8949, 0.0042), (0.0303, 0.0014), (0.799, 0.000), (1.253, 0.000)),
    (4, 0.5, (0.0001, 0.0000), (0.0484, 0.0050), (0.0012, 0.0002), (0.798, 0.000), (1.253, 0.000)),
    (6, 0.5, (0.0000, 0.0000), (0.0002, 0.0004), (0.0000, 0.0000), (0.798, 0.000), (1.253, 0.000)),
    (10, 0.5, (0.0000, 0.0000), (0.0000, 0.0000), (0.0000, 0.0000), (0.798, 0.000), (1.253, 0.000)),
    (INF, 0.5, (0.0000, 0.0000), (0.0000, 0.0000), (0.0000, 0.0000), (0.798, 0.000), (1.253, 0.000)),
    (1, 1, (1.0000, 0.0000), (1.0000, 0.0000), (0.7988, 0.0009), (1.000, 0.000), (1.000, 0.000)),
    (2, 1, (0.0588, 0.0003), (1.0000, 0.0000), (0.3024, 0.0077), (0.817, 0.000), (1.251, 0.002)),
    (3, 1, (0.0032, 0.0003), (0.9195, 0.0180), (0.0450, 0.0133), (0.799, 0.001), (1.255, 0.002)),
    (4, 1, (0.0004, 0.0001), (0.2476, 0.0625), (0.0196, 0.0093), (0.797, 0.001), (1.257, 0.002)),
    (6, 1, (0.0000, 0.0000), (0.0238, 0.0384), (0.0016, 0.0027), (0.797, 0.001), (1.255, 0.002)),
    (10, 1, (0.0000, 0.0000), (0.0000, 0.0000), (0.0000, 0.0000), (0.797, 0.000), (1.254, 0.000)),
    (INF, 1, (0.0000, 0.0000), (0.0000, 0.0000), (0.0000, 0.0000), (0.797, 0.000), (1.254, 0.000)),
)
TABLE37 = {(float(c), float(s)): dict(zip(TABLE37_KEYS, cols)) for c, s, *cols in _TABLE37_ROWS}

# Not measured: these columns are the paper's protocol settings, not measurements (weight decays of the
# matrix, auxiliary and tied groups; the training precision). muonlab has nothing to measure: its own run's
# values are settings, recorded in the run's optimizer_groups and config. By table, then optimizer.
SETTINGS = {
    "Table 3": {k: {"aux_wd": wd} for k, wd in (("hybrid", 0.01), ("sign", 0.00), ("afmuon", 0.00))},
    "Table 5": {k: {"aux_wd": wd} for k, wd in (("hybrid", 0.01), ("sign", 0.00), ("afmuon", 0.00))},
    "Table 7": {k: {"aux_wd": wd} for k, wd in (("hybrid", 0.01), ("sign", 0.00), ("afmuon", 0.00))},
    "Table 9": {k: {"matrix_wd": 0.1, "aux_tied_wd": wd, "precision": "FP32 + BF16"}
                for k, wd in (("hybrid", 0.01), ("sign", 0.00), ("afmuon", 0.00))},
    "Table 11": {k: {"aux_wd": wd} for k, wd in (("hybrid", 0.01), ("sign", 0.00), ("afmuon", 0.00))},
    "Table 13": {k: {"matrix_wd": 0.1, "aux_wd": wd, "tied_wd": wd, "precision": "FP32 + BF16"}
                 for k, wd in (("hybrid", 0.01), ("sign", 0.00), ("afmuon", 0.00))},
}


def for_tied(model_preset: str | None, kind: str | None) -> tuple[str, dict[str, float]] | None:
    """(source, {key: printed}) for `diagnose tied` on a run of this model preset and optimizer, or None."""
    if model_preset == TABLE13_MODEL and kind in TABLE13_GRAD_NORM:
        return TABLE13_SOURCE, {"grad_norm": TABLE13_GRAD_NORM[kind]}
    return None


def for_afmuon(model_preset: str | None, kind: str | None, cap: float,
               scale: float) -> tuple[str, dict[str, tuple[float, float]]] | None:
    """(source, {key: (mean, SD)}) for `diagnose afmuon` on a run of this model preset, optimizer and tied
    (cap, scale), or None: Table 22's row of the optimizer, Table 37's row of (c, s)."""
    if model_preset == TABLE22_MODEL and kind in TABLE22:
        return TABLE22_SOURCE, dict(TABLE22[kind])
    row = TABLE37.get((float(cap), float(scale)))
    if model_preset == TABLE37_MODEL and row is not None:
        return f"{TABLE37_SOURCE}, row c = {cap:g}, s = {scale:g}", dict(row)
    return None
