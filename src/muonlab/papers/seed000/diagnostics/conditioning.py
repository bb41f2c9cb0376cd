"""Seed 000 §4.4 item 2's synthetic conditioning benchmark, calibrated to its printed raw condition number.

Printed (seed 000 §4.4 item 2) for 4 x 128 x 128 "row-and-column-anisotropic
Gaussian matrices": the condition number kappa_2(G~) after each pre-polar rule, the post-NS5
orthogonality defect (BiEq only) and the cosine of the post-NS5 output with "the true isotropic
polar factor" (PRINTED). The paper ran it on CPU (§6, step 1: "standalone CPU ... conditioning
checks"), so `device` defaults to cpu; cuda runs the same draws (made on a CPU generator), its fp32
matmuls following torch's float32 matmul precision (TF32 under "high"; untouched here).

Unstated in the paper, fixed here (seed 000 §4.4 item 2 is silent); the choices are arguments:
- Matrices G = D_r Z D_c, Z i.i.d. N(0, 1) (the isotropic core, float64, seeded).
- Profile (`profile`): "geometric" (default): log10 of the row scales and of the column scales
  evenly spaced over [-d/2, d/2], d decades on each side. Deterministic, so the core is the only
  randomness; as Z is i.i.d. the order of the scales does not matter. "loguniform": log10 scales
  ~ U(-d/2, d/2) per matrix (adds the profile's own sampling noise).
- Calibration: d is solved at run time by bisection in float64 so that the batch mean of the raw
  kappa equals `target_kappa` (12,700.5) to `calibration_rtol`; every rule is measured at that d.
  A square Gaussian core's kappa is heavy-tailed (sigma_min ~ 1/n): the batch mean is led by its
  worst matrix and d varies with the seed; a seed whose core alone exceeds the target cannot be
  calibrated (reported, not hidden).
- kappa: sigma_max / sigma_min (float64 SVD) of each rule's conditioned matrix computed without
  rounding (float64) for every rule, batch mean: the paper's kappa_2(G~) of §3.3's conditioned
  G. Rounding first (up to 2^-9 relative in bf16) acts as noise that lifts sigma_min and makes
  kappa a discontinuous function of d (in a trial, bisection on bf16-rounded G missed the target
  by up to 29%, and rounding alone made one core's batch-mean kappa 4x larger). `kappa_input` is kappa of the matrix Polar
  Express actually gets at `precision`, rounded the same way for every rule (reported, not compared).
- Polar Express: 5 steps at `precision` ("bf16", default: the backbone's X = g.bfloat16();
  "fp32"); its input is every rule's conditioned matrix rounded to `precision`; Turbo-Muon's AOL
  scaling replaces the Frobenius normalisation on that rounded G (addons/turbo_aol.py).
- Defect: ||X^T X - I||_F / sqrt(k), k the smaller side. Cosine: <X, polar(Z)>_F / (|X| |polar(Z)|),
  polar(Z) = U V^T of the core. Batch means.
- Rules: row-RMS 1-pass and BiEq 2-pass bilateral at a = 1 (a synthetic matrix has no step);
  Zeta: V (fp32 state, §3.3) fed `zeta_steps` i.i.d. draws D_r Z_k D_c of the same profile, the
  last being G itself (V_t includes g_t), whitening bias-corrected at t = zeta_steps; Turbo-Muon
  AOL. Also measured, as a reference: Polar Express on the core Z itself (a perfect conditioner).

Printed vs measured: TOLERANCE (a printed value is reproduced when it lies in the central 80% of the
calibrated seeds' values: a band that settles as seeds are added, where the full range would only
widen) and PASSED_MEANS (calibration hit, and the printed orders held by the medians).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Callable, Literal

import torch

from muonlab.device import detect_device, one_intra_op_thread
from muonlab.settings import integer_at_least, seed_value
from muonlab.errors import UsageError
from muonlab.optim.addons.hbieq import hbieq
from muonlab.optim.addons.polar_precision import DTYPES
from muonlab.optim.addons.turbo_aol import aol_scale
from muonlab.optim.addons.zeta import zeta_update, zeta_whiten
from muonlab.optim.polar import polar_express
from muonlab.diagnostics import Command

# seed 000 §4.4 item 2 (4 x 128 x 128); a missing metric was not printed
PRINTED_SHAPE = (4, 128, 128)
PRINTED = {
    "raw": dict(kappa=12_700.5),
    "bieq2": dict(kappa=370.02, defect=0.19629, cosine=0.995400),
    "zeta_ema20": dict(kappa=577.58, cosine=0.947772),
    "rowrms1": dict(kappa=2_401.9, cosine=0.925878),
    "turbo_aol": dict(kappa=3_776.75, cosine=0.894950),
}
RULES = ("raw", "bieq2", "zeta_ema20", "rowrms1", "turbo_aol")
LABELS = {"raw": "raw (none)", "bieq2": "BiEq 2-pass bilateral", "zeta_ema20": "Zeta 20-step EMA",
          "rowrms1": "row-RMS 1-pass", "turbo_aol": "Turbo-Muon AOL"}
# the printed orders: kappa ascending, cosine descending (raw's cosine was not printed)
KAPPA_ORDER = ("bieq2", "zeta_ema20", "rowrms1", "turbo_aol", "raw")
COSINE_ORDER = ("bieq2", "zeta_ema20", "rowrms1", "turbo_aol")
# Zeta's step-0 cosine with plain Polar Express, printed for a real step-0 gradient (§4.4 item 1)
PRINTED_ZETA_STEP0_COSINE = 0.649479


@dataclass(frozen=True)
class ConditioningConfig:
    """The benchmark's settings (module doc); every field acts."""

    seed: int = 0
    seeds: int = 32                      # seeds seed .. seed+seeds-1: the sampling spread
    shape: tuple[int, int, int] = PRINTED_SHAPE
    profile: Literal["geometric", "loguniform"] = "geometric"
    target_kappa: float = PRINTED["raw"]["kappa"]
    calibration_rtol: float = 1e-6
    precision: Literal["bf16", "fp32"] = "bf16"
    device: str = "cpu"
    polar_steps: int = 5
    zeta_steps: int = 20
    zeta_beta2: float = 0.99

    def validate(self) -> None:
        if self.profile not in ("geometric", "loguniform"):
            raise UsageError(f"profile must be geometric or loguniform, got {self.profile!r}")
        if self.precision not in DTYPES:
            raise UsageError(f"precision must be one of {', '.join(DTYPES)}, got {self.precision!r}")
        if self.seeds < 1 or self.zeta_steps < 1 or not 1 <= self.polar_steps <= 5:
            raise UsageError("seeds and zeta_steps must be >= 1 and polar_steps in 1..5")
        if len(self.shape) != 3 or min(self.shape) < 1 or self.target_kappa <= 1 or self.calibration_rtol <= 0:
            raise UsageError("shape must be (batch, m, n) >= 1, target_kappa > 1, calibration_rtol > 0")


# ------------------------------------------------------------------------------ metrics
def kappa(X: torch.Tensor) -> torch.Tensor:
    """sigma_max / sigma_min of each matrix, from a float64 SVD."""
    s = torch.linalg.svdvals(X.double())
    return s[..., 0] / s[..., -1]


def defect(X: torch.Tensor) -> torch.Tensor:
    """||X^T X - I||_F / sqrt(k) on the smaller side k of each matrix."""
    X = X.double()
    k = min(X.shape[-2:])
    A = X.mT @ X if X.size(-2) >= X.size(-1) else X @ X.mT
    return (A - torch.eye(k, dtype=A.dtype, device=A.device)).norm(dim=(-2, -1)) / math.sqrt(k)


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Frobenius cosine of each pair of matrices."""
    a, b = a.double(), b.double()
    return (a * b).sum(dim=(-2, -1)) / (a.norm(dim=(-2, -1)) * b.norm(dim=(-2, -1)))


def polar_factor(Z: torch.Tensor) -> torch.Tensor:
    """U V^T of each matrix (the true polar factor), float64."""
    U, _, Vh = torch.linalg.svd(Z.double(), full_matrices=False)
    return U @ Vh


# ------------------------------------------------------------------------------ the matrices
@dataclass
class Draw:
    """One seed's cores: `core` is the current matrix's Z, `history` Zeta's earlier draws."""

    core: torch.Tensor           # [b, m, n] float64
    history: list[torch.Tensor]  # zeta_steps - 1 cores of the same shape
    unit_rows: torch.Tensor      # [b, m, 1] log10 scale per decade (profile shape)
    unit_cols: torch.Tensor      # [b, 1, n]

    def scaled(self, Z: torch.Tensor, decades: float) -> torch.Tensor:
        return 10 ** (decades * self.unit_rows) * Z * 10 ** (decades * self.unit_cols)


def draw(cfg: ConditioningConfig, seed: int, device: torch.device) -> Draw:
    """The cores (CPU generator: the same numbers on every device) and the profile's shape."""
    b, m, n = cfg.shape
    gen = torch.Generator().manual_seed(seed)
    kw = dict(generator=gen, dtype=torch.float64)
    core = torch.randn(b, m, n, **kw)
    history = [torch.randn(b, m, n, **kw) for _ in range(cfg.zeta_steps - 1)]
    if cfg.profile == "geometric":
        rows = torch.linspace(-0.5, 0.5, m, dtype=torch.float64).expand(b, m)
        cols = torch.linspace(-0.5, 0.5, n, dtype=torch.float64).expand(b, n)
    else:
        rows, cols = torch.rand(b, m, **kw) - 0.5, torch.rand(b, n, **kw) - 0.5
    return Draw(core.to(device), [h.to(device) for h in history],
                rows.reshape(b, m, 1).to(device), cols.reshape(b, 1, n).to(device))


# ------------------------------------------------------------------------------ calibration
def bisect(f: Callable[[float], float], target: float, rtol: float, hi: float = 1.0,
           max_hi: float = 16.0, max_iter: int = 200) -> dict:
    """x >= 0 with f(x) = target to rtol, f increasing: bracket [0, hi] doubled up to max_hi, then
    bisection in float64. Returns x, f(x), iterations and `reached`; `why` when no root is bracketed.
    """
    f0 = f(0.0)
    if f0 >= target * (1 + rtol):
        return dict(x=0.0, value=f0, iterations=0, reached=False,
                    why=f"already {f0:,.1f} >= {target:,.1f} with no anisotropy (the core's own kappa)")
    lo, f_hi = 0.0, f(hi)
    while f_hi < target and hi < max_hi:
        lo, hi = hi, 2 * hi
        f_hi = f(hi)
    if f_hi < target:
        return dict(x=hi, value=f_hi, iterations=0, reached=False, why=f"{f_hi:,.1f} < target at {hi:g} decades")
    x, value = hi, f_hi
    for it in range(1, max_iter + 1):
        x = 0.5 * (lo + hi)
        value = f(x)
        if abs(value / target - 1) <= rtol:
            return dict(x=x, value=value, iterations=it, reached=True)
        lo, hi = (x, hi) if value < target else (lo, x)
    return dict(x=x, value=value, iterations=max_iter, reached=abs(value / target - 1) <= rtol,
                why="bisection did not converge (kappa not continuous in the profile?)")


def calibrate(cfg: ConditioningConfig, d: Draw) -> dict:
    """The decades d at which the batch-mean raw kappa (float64 G) is cfg.target_kappa."""
    return bisect(lambda x: kappa(d.scaled(d.core, x)).mean().item(), cfg.target_kappa, cfg.calibration_rtol)


# ------------------------------------------------------------------------------ the rules
def conditioned(G: torch.Tensor, history: list[torch.Tensor], cfg: ConditioningConfig) -> dict[str, torch.Tensor]:
    """Each rule's conditioned matrix, in G's dtype (float64 here: no rounding)."""
    V = torch.zeros(G.shape, dtype=torch.float32, device=G.device)  # Zeta's fp32 state (§3.3)
    for g in (*history, G):  # its EMA over the draws, the current one last (V_t includes g_t)
        zeta_update(V, g, cfg.zeta_beta2)
    return {
        "raw": G,
        "bieq2": hbieq(G.clone(), 1.0, passes=2, sides="both"),
        "zeta_ema20": zeta_whiten(G.clone(), V, 1 - cfg.zeta_beta2 ** cfg.zeta_steps, 1e-8),
        "rowrms1": hbieq(G.clone(), 1.0, passes=1, sides="row"),
        "turbo_aol": aol_scale(G),
    }


def polar_inputs_and_outputs(G: torch.Tensor, exact: dict[str, torch.Tensor],
                             cfg: ConditioningConfig) -> tuple[dict, dict]:
    """Polar Express at cfg.precision: every rule's input rounded to it, and the outputs."""
    dtype = DTYPES[cfg.precision]
    inputs, outputs = {}, {}
    for rule, Xc in exact.items():
        if rule == "turbo_aol":  # AOL replaces the normalisation, on the rounded G (backbone)
            inputs[rule] = aol_scale(G.to(dtype))
            outputs[rule] = polar_express(G.to(dtype), cfg.polar_steps, dtype=dtype, normalize="aol")
        else:
            inputs[rule] = Xc.to(dtype)
            outputs[rule] = polar_express(inputs[rule], cfg.polar_steps, dtype=dtype)
    return inputs, outputs


def measure_seed(cfg: ConditioningConfig, seed: int, device: torch.device) -> dict:
    """Calibrate one seed's profile and measure every rule there (and the core itself, "core")."""
    d = draw(cfg, seed, device)
    cal = calibrate(cfg, d)
    decades = cal["x"]
    G = d.scaled(d.core, decades)
    exact = conditioned(G, [d.scaled(h, decades) for h in d.history], cfg)
    exact["core"] = d.core  # a perfect conditioner: the ceiling of defect and cosine
    inputs, outputs = polar_inputs_and_outputs(G, exact, cfg)
    target = polar_factor(d.core)
    rules = {}
    for rule in (*RULES, "core"):
        k = kappa(exact[rule])
        rules[rule] = dict(kappa=k.mean().item(), kappa_median=k.median().item(),
                           kappa_input=kappa(inputs[rule]).mean().item(),
                           defect=defect(outputs[rule]).mean().item(),
                           cosine=cosine(outputs[rule], target).mean().item())
    dtype = DTYPES[cfg.precision]  # Zeta at step 0: V = g^2, so G / (|G| + eps) ~ sign(G)
    step0 = polar_express(zeta_whiten(G.clone(), G.square(), 1.0, 1e-8).to(dtype), cfg.polar_steps, dtype=dtype)
    plain = polar_express(G.to(dtype), cfg.polar_steps, dtype=dtype)
    return dict(seed=seed, calibration=dict(decades=decades, raw_kappa=cal["value"], iterations=cal["iterations"],
                                            reached=cal["reached"], why=cal.get("why"),
                                            core_kappa=rules["core"]["kappa"]),
                tensor_device=str(G.device), rules=rules,
                zeta_step0_cosine_with_plain=cosine(step0, plain).mean().item())


# ------------------------------------------------------------------------------ printed vs measured
BAND = (0.10, 0.90)  # the central 80% of the seeds' values: the tolerance band (TOLERANCE)
TOLERANCE = ("raw kappa: calibrated to the printed value within calibration_rtol. Every other printed value "
             "counts as reproduced when it lies in the central 80% (10th to 90th percentile) of the calibrated "
             "seeds' values: the sampling spread of the core draw, which the paper does not give (a square "
             "Gaussian core's kappa is heavy-tailed, and the calibrated anisotropy follows it); unlike the full "
             "range, the band does not widen as seeds are added. 'printed at' is the share of seeds below it")
PASSED_MEANS = ("the first seed's raw kappa hits the printed 12,700.5 within calibration_rtol, the medians over "
                "the calibrated seeds order the conditioners as printed, by kappa (BiEq < Zeta < row-RMS < Turbo "
                "< raw) and by cosine (BiEq > Zeta > row-RMS > Turbo), and every printed value lies in its band "
                "(TOLERANCE): the values this benchmark claims to reproduce are reproduced")


def compare(primary: dict, ensemble: list[dict], rtol: float) -> list[dict]:
    """One row per printed number: printed, the first seed's value, the seeds' median / min / max, and
    whether it is reproduced (TOLERANCE); `why` says what a miss can and cannot be put down to."""
    ceiling = max(r["rules"]["core"]["cosine"] for r in ensemble) if ensemble else math.nan
    cells = []
    for rule, printed in PRINTED.items():
        for metric, p in printed.items():
            values = sorted(r["rules"][rule][metric] for r in ensemble)
            cell = dict(rule=rule, metric=metric, printed=p, measured=primary["rules"][rule][metric],
                        median=_median(values), min=values[0] if values else math.nan,
                        max=values[-1] if values else math.nan, low=_quantile(values, BAND[0]),
                        high=_quantile(values, BAND[1]),
                        percentile=sum(v < p for v in values) / len(values) if values and rule != "raw" else None,
                        why=None)
            if rule == "raw":
                cell["within"] = primary["calibration"]["reached"] and abs(cell["measured"] / p - 1) <= rtol
                cell["tolerance"] = f"rel {rtol:g}"
                if not cell["within"]:
                    cell["why"] = f"not calibrated: {primary['calibration']['why']}"
            else:
                cell["within"] = bool(values) and cell["low"] <= p <= cell["high"]
                cell["tolerance"] = f"central 80% of {len(values)} seeds"
                if not cell["within"] and metric == "cosine" and p > ceiling:
                    cell["why"] = (f"above the cosine Polar Express reaches on the isotropic core itself (at most "
                                   f"{ceiling:.4f} over these seeds), i.e. above what a perfect conditioner gives "
                                   f"with this Polar Express and this cosine; the paper's definitions are unstated")
                elif not cell["within"]:
                    side = "below" if p < cell["low"] else "above"
                    cell["why"] = (f"{side} the central 80% of {len(values)} calibrated seeds (printed at the "
                                   f"{100 * cell['percentile']:.0f}th percentile): the paper's core draw and the "
                                   f"shape of its anisotropy profile are unstated")
            cells.append(cell)
    return cells


def orders(ensemble: list[dict], rules: dict | None = None) -> dict:
    """The rules sorted by the seeds' median kappa (ascending) and cosine (descending), beside the printed."""
    med = {rule: {m: _median(sorted(r["rules"][rule][m] for r in ensemble)) for m in ("kappa", "cosine")}
           for rule in RULES} if rules is None else rules
    by_kappa = sorted(KAPPA_ORDER, key=lambda r: med[r]["kappa"])
    by_cosine = sorted(COSINE_ORDER, key=lambda r: -med[r]["cosine"])
    return dict(kappa=dict(printed=list(KAPPA_ORDER), measured=by_kappa, holds=by_kappa == list(KAPPA_ORDER)),
                cosine=dict(printed=list(COSINE_ORDER), measured=by_cosine, holds=by_cosine == list(COSINE_ORDER)))


def verdict(primary: dict, order: dict | None, cells: list[dict] | None = None) -> bool:
    """PASSED_MEANS: the first seed calibrated, both printed orders held by the seeds' medians, and
    every printed value (`cells`) inside its band."""
    return bool(primary["calibration"]["reached"] and order is not None and order["kappa"]["holds"]
                and order["cosine"]["holds"] and all(c["within"] for c in cells or ()))


def _quantile(values: list[float], q: float) -> float:
    """The q-quantile of sorted `values`, linear between order statistics (numpy's default)."""
    if not values:
        return math.nan
    pos = q * (len(values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (pos - lo) * (values[hi] - values[lo])


def _median(values: list[float]) -> float:
    return _quantile(values, 0.5)


def run(cfg: ConditioningConfig | None = None, json: bool = False, **settings) -> dict:
    """The benchmark: cfg.seeds seeds from cfg.seed, each calibrated, measured, compared with PRINTED.

    `settings` are ConditioningConfig fields, on top of `cfg` (default ConditioningConfig()); `json`
    is accepted for the CLI and changes nothing here.
    """
    settings = {k: tuple(v) if k == "shape" else v for k, v in settings.items()}
    cfg = replace(cfg or ConditioningConfig(), **settings)
    cfg.validate()
    device = detect_device(cfg.device)
    with torch.no_grad(), one_intra_op_thread():
        seeds = [measure_seed(cfg, s, device) for s in range(cfg.seed, cfg.seed + cfg.seeds)]
    primary = seeds[0]
    ensemble = [r for r in seeds if r["calibration"]["reached"]]
    cells = compare(primary, ensemble, cfg.calibration_rtol)
    order = orders(ensemble) if ensemble else None
    passed = verdict(primary, order, cells)
    return dict(setup=dict(asdict(cfg), device=str(device), paper_shape=list(PRINTED_SHAPE)),
                tolerance=TOLERANCE, passed_means=PASSED_MEANS, primary=primary,
                seeds=dict(calibrated=[r["seed"] for r in ensemble],
                           not_calibrated={str(r["seed"]): r["calibration"]["why"] for r in seeds
                                           if not r["calibration"]["reached"]},
                           per_seed=[dict(seed=r["seed"], calibration=r["calibration"],
                                          **{m: {rule: r["rules"][rule][m] for rule in RULES}
                                             for m in ("kappa", "defect", "cosine")}) for r in seeds]),
                cells=cells, orders=order, cells_within=sum(c["within"] for c in cells), cells_total=len(cells),
                passed=passed)


def _num(x: float) -> str:
    if x != x:
        return "-"
    return f"{x:,.1f}" if abs(x) >= 100 else f"{x:.4f}"


def format_table(result: dict) -> str:
    s, p = result["setup"], result["primary"]
    cal = p["calibration"]
    b, m, n = s["shape"]
    lines = [f"seed 000 §4.4 item 2 conditioning benchmark: {b}x{m}x{n} (paper: 4x128x128), {s['profile']} row/column "
             f"scales, Polar Express {s['polar_steps']} steps in {s['precision']} on {s['device']}",
             f"seed {p['seed']}: {cal['decades']:.6f} decades each side by bisection ({cal['iterations']} steps): "
             f"raw kappa {cal['raw_kappa']:,.3f} (target {s['target_kappa']:,.1f}, rtol {s['calibration_rtol']:g}; "
             f"core alone {cal['core_kappa']:,.1f})" + ("" if cal["reached"] else f" NOT CALIBRATED: {cal['why']}"),
             f"seeds {s['seed']}..{s['seed'] + s['seeds'] - 1}: {len(result['seeds']['calibrated'])} calibrated"
             + "".join(f"; seed {k} not: {v}" for k, v in result["seeds"]["not_calibrated"].items()),
             "", f"{'rule':<22} {'metric':<7} {'printed':>10} {'seed ' + str(p['seed']):>10} {'median':>10} "
             f"{'p10':>10} {'p90':>10} {'printed at':>10}  reproduced"]
    for c in result["cells"]:
        lines.append(f"{LABELS[c['rule']]:<22} {c['metric']:<7} {_num(c['printed']):>10} {_num(c['measured']):>10} "
                     f"{_num(c['median']):>10} {_num(c['low']):>10} {_num(c['high']):>10} "
                     f"{'' if c['percentile'] is None else format(c['percentile'], '.0%'):>10}  "
                     f"{'yes' if c['within'] else 'NO'} ({c['tolerance']})")
    lines.append("")
    for c in result["cells"]:
        if c["why"]:
            lines.append(f"{LABELS[c['rule']]} {c['metric']}: {c['why']}")
    lines += ["", f"tolerance: {result['tolerance']}"]
    if result["orders"]:
        for metric, o in result["orders"].items():
            sep = " < " if metric == "kappa" else " > "
            lines.append(f"order by median {metric}: {sep.join(o['measured'])} "
                         f"({'as printed' if o['holds'] else 'printed: ' + sep.join(o['printed'])})")
    lines += ["", f"seed {p['seed']}, not compared (defect and cosine of Polar Express; kappa of its "
                  f"{s['precision']} input, every rule rounded alike):"]
    for rule in (*RULES, "core"):
        r = p["rules"][rule]
        label = LABELS.get(rule, "core Z itself (ideal)")
        lines.append(f"  {label:<22} defect {r['defect']:.4f}  cosine {r['cosine']:.6f}  "
                     f"kappa {r['kappa']:,.1f}  kappa at input {r['kappa_input']:,.1f}")
    lines.append(f"  Zeta step 0 (~sign G) cosine with plain Polar Express {p['zeta_step0_cosine_with_plain']:.6f} "
                 f"(paper {PRINTED_ZETA_STEP0_COSINE} on a real step-0 gradient: not comparable)")
    outside = [f"{c['rule']} {c['metric']}" for c in result["cells"] if not c["within"]]
    lines += ["", f"cells reproduced: {result['cells_within']} of {result['cells_total']}"
              + (f"; outside their band: {', '.join(outside)}" if outside else ""),
              f"passed: {'yes' if result['passed'] else 'NO'} ({result['passed_means']})"]
    return "\n".join(lines)


COMMAND = Command(
    'conditioning', "seed 000 §4.4 item 2 synthetic conditioning benchmark: anisotropy calibrated to the printed raw "
    "kappa 12,700.5, then kappa, defect and cosine per conditioner, printed vs measured",
    options=(("--seed", dict(type=seed_value, default=0, help="first seed of the Gaussian cores (default 0)")),
        ("--seeds", dict(type=integer_at_least(1), default=32, help="seeds measured, each calibrated: the sampling "
        "spread that is the tolerance (default 32)")),
        ("--profile", dict(default="geometric", choices=("geometric", "loguniform"),
        help="row/column scale profile, unstated in the paper (default geometric)")),
        ("--precision", dict(default="bf16", choices=("bf16", "fp32"),
        help="Polar Express precision (default bf16, the paper's backbone)")),
        ("--device", dict(default="cpu", help="cpu (the paper's, default), cuda, ..."))),
    run=lambda a: run(seed=a.seed, seeds=a.seeds, profile=a.profile,
        precision=a.precision, device=a.device),
    format=format_table)
