"""Step-0 precision/epsilon audit of seed paper 002 (§4.5 item 2; routing in §2.1 Tier 3),
on the real model: the initialisation and step-0 micro-batches of a preset, arm and seed (or a run
directory), built and stepped by the training code itself (step0_trajectory.first_steps).

At step 0 every c_proj weight and OE table is zero, so each block is the identity in forward and
backward and the readout is x_out = alpha_0 x0, alpha_0 the resid/x0-lambda product-sum (1 + 0.1 L).
Every x0/wte/out-lambda gradient then equals dL/dalpha = sum_t <dL/dN_t, dN_eps(alpha x0_t)/dalpha>,
with dN_eps/dalpha = eps x0 / (alpha^2 q + eps)^(3/2): exactly 0 at eps = 0 (RMSNorm scale
invariance), linear in a small eps, while rounding at the run's precision leaves a gradient (bf16:
~1e-7..1e-6) that AdamW's first step -lr g / (|g| + eps) turns into ~-+lr.

What is computed:
- measured: the gradient of each scalar as the run's loop produced it (its device, precision and
  compile; mean over the step's micro-batches), the optimizer's actual step-0 displacement, and
  each family's lr, eps, weight decay read off the built optimizer's group after the schedule
  (resid_lambdas 0.01 scalar_lr = 0.005, x0/wte/out scalar_lr = 0.5 at upstream's settings);
- float64: a CPU float64 copy of the initial model (bf16 tables cast exactly; logits, soft cap
  and loss in float64; shden's anchor too, keeping its own routing_eps) on the same micro-batches,
  with every `muonlab.model.gpt.norm` call at eps in `eps_values` (`norm_eps`; gpt.py unchanged),
  and seed 002 §4.5 item 2's reduced loss CE(softcap(lm_head(N_eps(alpha x0)))) differentiated by autograd on alpha
  as an independent route;
- dtheta0 = -lr wd p0 - lr g / (|g| + eps): AdamW's first update at t = 1 for the float64 and the
  measured gradient, at each family's own lr.
Checks ("passed"): the eps = 0 float64 gradient vanishes (<= 1e-10 max |dL/d lm_head|); at eps > 0
the model's float64 gradient of every scalar on x0 equals the reduced dL/dalpha (rtol 1e-6 plus 4x the
rounding floor, the largest eps = 0 gradient; shden's anchor only at its own routing_eps, `_anchored_at_x0`);
dL/dalpha is linear in eps (rtol 1e-2: the eps in (alpha^2 q + eps)^(3/2), amplified where the
per-token terms cancel); the optimizer's actual displacement equals dtheta0 of the measured
gradient (8 ulp).
Paper (seed 002 §4.5 item 2, d6 ClimbMix, compiled bf16 on a GPU, seeds 41/42/47) is printed beside the measured
values; they compare in value only under that protocol (`protocol_matches`).

Choices: the float64 analysis always runs on CPU (independent of the device; FA3 has no float64);
the run's own step0_mode acts (a nostep0 arm's controlled scalars show no displacement).
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from muonlab.papers.seed002.diagnostics.step0_trajectory import SHORT, cli_args, first_steps, protocol_matches, setup  # noqa: F401
from muonlab.model import find_variant
from muonlab.model import gpt as gpt_module
from muonlab.model.gpt import LOGIT_SOFTCAP
from muonlab.optim.step0 import ALL_FAMILIES
from muonlab.diagnostics import Command, STEP0_RUN_OPTIONS

FAMILIES = ALL_FAMILIES
EPS_VALUES = (0.0, 2.0**-23, 1e-6)
# seed 002 §4.5 item 2: per seed, float64 dL/dalpha at eps 0 / 2^-23 / 1e-6, compiled bf16 grads, bf16/true ratio
PAPER_STEP0 = {
    41: {"dL_dalpha": {"0": -5.665e-21, "2^-23": 3.384e-12, "1e-06": 2.839e-11},
         "x0_wte_lambdas": 1.758e-06, "out_lambdas": 1.620e-06, "ratio": 5.2e5},
    42: {"dL_dalpha": {"0": 6.884e-20, "2^-23": 7.582e-12, "1e-06": 6.360e-11},
         "x0_wte_lambdas": -1.298e-06, "out_lambdas": -1.221e-06, "ratio": -1.7e5},
    47: {"dL_dalpha": {"0": 4.232e-20, "2^-23": 3.596e-13, "1e-06": 3.017e-12},
         "x0_wte_lambdas": 1.478e-07, "out_lambdas": 1.210e-07, "ratio": 4.1e5},
}


@contextlib.contextmanager
def norm_eps(eps: float) -> Iterator[None]:
    """Within the block, every `muonlab.model.gpt.norm` call uses RMSNorm epsilon `eps`."""
    if not eps >= 0.0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    original = gpt_module.norm

    def norm(x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.size(-1),), eps=eps)

    gpt_module.norm = norm
    try:
        yield
    finally:
        gpt_module.norm = original


def float64_model(model) -> Any:
    """A CPU float64 copy (SDPA attention) whose logits, soft-cap, loss and shden anchor stay float64."""
    m64 = copy.deepcopy(model).to(device="cpu", dtype=torch.float64)
    for block in m64.transformer.h:
        block.attn.backend, block.attn.flash_attn_func = "sdpa", None
    m64._logits = lambda x: LOGIT_SOFTCAP * torch.tanh(m64.lm_head(x) / LOGIT_SOFTCAP)  # type: ignore[method-assign]
    routing = find_variant(m64, "routing")
    if routing is not None and routing.cfg.kind == "shden":  # its anchor computes inv_rms and w * inv_rms in fp32
        eps = routing.cfg.eps
        routing.anchor = lambda w, e: w * torch.rsqrt(  # type: ignore[method-assign]
            (w if e is None else w + e).square().mean(-1, keepdim=True) + eps)
    return m64


def family_grads(model, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[float, dict[str, torch.Tensor]]:
    """Mean loss over the micro-batches and the .grad of the scalar families and lm_head, accumulated
    as the loop does ((loss / n).backward() per micro-batch)."""
    model.zero_grad(set_to_none=True)
    total = 0.0
    for x, y in batches:
        loss = model(x, y)
        (loss / len(batches)).backward()
        total += float(loss.detach()) / len(batches)
    params = {n: getattr(model, n) for n in FAMILIES if hasattr(model, n)} | {"lm_head": model.lm_head.weight}
    return total, {n: p.grad.detach().double().clone() for n, p in params.items()}


def reduced_dl_dalpha(m64, batches: list[tuple[torch.Tensor, torch.Tensor]], alpha0: float) -> float:
    """Seed 002 §4.5 item 2's reduced loss L(alpha) = mean CE(softcap(lm_head(N(alpha x0)))), d/dalpha at alpha0 (current norm)."""
    alpha = torch.tensor(alpha0, dtype=torch.float64, requires_grad=True)
    loss = 0.0
    for idx, targets in batches:
        with torch.no_grad():
            w = m64.transformer.wte(idx)
            embed = m64.points.embed
            x0 = gpt_module.norm(w if embed is None else w + embed(idx))
        logits = m64._logits(gpt_module.norm(alpha * x0))
        ce = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        loss = loss + ce / len(batches)
    (g,) = torch.autograd.grad(loss, alpha)
    return float(g)


def readout_alpha(model) -> float:
    """alpha_0: x = x0; x <- r_i x + l_i x0 per layer; + out_lambdas[0] (sublayers and anchors off)."""
    a = 1.0
    for r, lam in zip(model.resid_lambdas.tolist(), model.x0_lambdas.tolist()):
        a = r * a + lam
    return a + (float(model.out_lambdas[0].detach()) if hasattr(model, "out_lambdas") else 0.0)


def eps_label(eps: float) -> str:
    return "2^-23" if eps == 2.0**-23 else f"{eps:g}"


def adamw_step0(g: float, lr: float, eps: float, weight_decay: float = 0.0, p0: float = 0.0) -> float:
    """AdamW's first update at t = 1 (bias-corrected m/sqrt(v) = g/|g|): -lr wd p0 - lr g / (|g| + eps)."""
    return -lr * weight_decay * p0 - lr * g / (abs(g) + eps)


def _ratio(a: float, b: float) -> float:
    return a / b if b != 0 else (math.copysign(math.inf, a) if a != 0 else math.nan)


def run_step0_audit(run: str | Path | None = None, preset: str | None = None, arm: str | None = None,
                    seed: int | None = None, settings: dict[str, Any] | None = None, device: str | None = None,
                    precision: str | None = None, eps_values: tuple[float, ...] = EPS_VALUES,
                    log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The module docstring's audit of the run's step 0 (defaults: step0_trajectory.setup's)."""
    s = setup(run, preset, arm, seed, settings, device, precision, log)
    st = first_steps(s, 1, keep_init=True)
    r0 = st.records[0]
    with torch.no_grad(), s.runtime.autocast():  # the init model's step-0 loss at the run's precision
        run_loss = sum(float(st.init(x, y)) for x, y in st.batches) / len(st.batches)
    batches = [(x.cpu(), y.cpu()) for x, y in st.batches]
    labels = [eps_label(e) for e in eps_values]
    alpha0 = readout_alpha(st.init)
    m64 = float64_model(st.init)
    loss64, g64, dl_da, lm_scale = {}, {}, {}, {}
    for eps, lab in zip(eps_values, labels):
        with norm_eps(eps):
            loss64[lab], g64[lab] = family_grads(m64, batches)
            dl_da[lab] = reduced_dl_dalpha(m64, batches, alpha0)
        lm_scale[lab] = float(g64[lab].pop("lm_head").abs().max())
    families: dict[str, Any] = {}
    for name, f in r0["families"].items():
        lr, eps, wd = f["lr"], f["eps"], f["weight_decay"]
        f64 = {lab: g64[lab][name].tolist() for lab in labels}
        meas = f["grad"]
        families[name] = {
            "lr": lr, "betas": f["betas"], "eps": eps, "weight_decay": wd, "init": f["value_before"],
            "float64": f64, "measured": meas, "optimizer_saw_gradient": f["grad_seen"] is not None,
            "ratio": {lab: [_ratio(a, b) for a, b in zip(meas, f64[lab])] for lab in labels},
            "diff": {lab: [a - b for a, b in zip(meas, f64[lab])] for lab in labels},
            "displacement": {
                "float64": {lab: [adamw_step0(g, lr, eps, wd, p) for g, p in zip(f64[lab], f["value_before"])]
                            for lab in labels},
                "measured_predicted": [adamw_step0(g, lr, eps, wd, p) for g, p in zip(meas, f["value_before"])],
                "optimizer": [b - a for a, b in zip(f["value_before"], f["value_after_update"])],
                "after_step0_control": [b - a for a, b in zip(f["value_before"], f["value"])]},
        }
    d = s.describe()
    result = {"config": d, "eps_values": list(eps_values), "eps_labels": labels, "alpha0": alpha0,
              "micro_batches": len(batches), "tokens": sum(x.numel() for x, _ in batches),
              "loss": {"float64": loss64, d["precision"]: run_loss, "logged_last_micro_batch": r0["loss"]},
              "dL_dalpha": dl_da,
              "lm_head_grad_max": lm_scale, "families": families, "protocol_matches": protocol_matches(d),
              "paper": PAPER_STEP0.get(d["seed"])}
    result["checks"] = _checks(result)
    result["passed"] = all(c["passed"] for c in result["checks"])
    return result


def _anchored_at_x0(result: dict[str, Any], eps: float) -> list[tuple[str, int]]:
    """The scalars whose gradient is dL/dalpha at step 0: x0_lambdas, out_lambdas[0], and those on the
    routing anchor a_w (wte_lambdas, out_lambdas[1]) where a_w = x0 there: sepden's norm(w) (e = 0), or
    shden's w / s_w(routing_eps) when routing_eps is the norm's eps (seed 002 §4.5 item 1: 1e-6 is not 2^-23)."""
    fams, c = result["families"], result["config"]
    a_w = c["routing"] == "sepden" or (c["routing"] == "shden" and c["routing_eps"] == eps)
    picked = [("x0_lambdas", i) for i in range(len(fams["x0_lambdas"]["measured"]))]
    if "out_lambdas" in fams:
        picked += [("out_lambdas", 0)] + ([("out_lambdas", 1)] if a_w else [])
    if "wte_lambdas" in fams and a_w:
        picked += [("wte_lambdas", i) for i in range(len(fams["wte_lambdas"]["measured"]))]
    return picked


def _checks(result: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    fams, labels = result["families"], result["eps_labels"]
    ref = result["lm_head_grad_max"].get("0")
    if ref is not None:
        worst = max(abs(g) for f in fams.values() for g in f["float64"]["0"])
        worst = max(worst, abs(result["dL_dalpha"]["0"]))
        out.append({"check": "float64 eps = 0: every scalar gradient and dL/dalpha vanish (scale invariance)",
                    "passed": worst <= 1e-10 * ref, "detail": f"max {worst:.3e} vs 1e-10 x {ref:.3e}"})
    # float64 rounding of these sums: the eps = 0 gradients (exactly 0 in real arithmetic), else 1 ulp of dL/dW
    floor = (max(abs(g) for f in fams.values() for g in f["float64"]["0"]) if "0" in labels
             else 2.0**-52 * max(result["lm_head_grad_max"].values()))
    for eps, lab in zip(result["eps_values"], labels):
        if eps == 0:
            continue
        dl = result["dL_dalpha"][lab]
        picked = _anchored_at_x0(result, eps)
        err = max(abs(fams[n]["float64"][lab][i] - dl) for n, i in picked)
        names = "/".join(dict.fromkeys(f"{SHORT[n]}" for n, _ in picked))
        ok = err <= 1e-6 * abs(dl) + 4 * floor and abs(dl) > 4 * floor
        out.append({"check": f"float64 eps = {lab}: {names} gradients = reduced dL/dalpha (rtol 1e-6 + 4x the "
                             "float64 rounding floor)", "passed": ok,
                    "detail": f"dL/dalpha {dl:+.4e}, max diff {err:.2e}, floor {floor:.1e}"})
    pos = [(e, lab) for e, lab in zip(result["eps_values"], labels) if e > 0]
    if len(pos) >= 2:
        (e1, l1), (e2, l2) = pos[0], pos[-1]
        got, want = result["dL_dalpha"][l2] / result["dL_dalpha"][l1], e2 / e1
        out.append({"check": f"dL/dalpha linear in eps: ratio eps={l2} / eps={l1} = {want:.4g} (rtol 1e-2)",
                    "passed": abs(got - want) <= 1e-2 * want, "detail": f"measured {got:.6g}"})
    worst, where = 0.0, "none"
    for name, f in fams.items():
        if not f["optimizer_saw_gradient"]:
            continue
        for i, (a, b) in enumerate(zip(f["displacement"]["optimizer"], f["displacement"]["measured_predicted"])):
            scale = max(abs(f["init"][i]), abs(f["init"][i] + a), abs(b), 1e-30)
            err = abs(a - b) / (8 * torch.finfo(torch.float32).eps * scale)
            if err > worst:
                worst, where = err, f"{name}[{i}]"
    out.append({"check": "optimizer's step-0 displacement = -lr g/(|g|+eps) at the group's lr (8 ulp)",
                "passed": worst <= 1.0, "detail": f"worst {worst:.3g} x tolerance at {where}"})
    return out


def format_step0_table(result: dict[str, Any]) -> str:
    """A text table: one row per scalar (family[i]); lr, float64 per eps, measured, ratio, step-0 jump."""
    labels, c = result["eps_labels"], result["config"]
    ref = "2^-23" if "2^-23" in labels else labels[-1]
    head = [f"step-0 precision/epsilon audit (seed 002 §4.5 item 2): {c['preset_or_run']} arm {c['arm']} seed {c['seed']}, "
            f"{c['device']} {c['precision']} compile={c['compile']}; depth {c['depth']} width {c['width']} vocab "
            f"{c['vocab']}, step 0 = {result['micro_batches']} micro-batches, {result['tokens']:,} tokens "
            f"({c['data_source']}), step0_mode {c['step0_mode']}",
            f"alpha0 = {result['alpha0']:.4f}; reduced dL/dalpha (float64): "
            + ", ".join(f"eps={lab}: {result['dL_dalpha'][lab]:+.3e}" for lab in labels),
            "max |dL/d lm_head| (float64): " + ", ".join(f"{result['lm_head_grad_max'][lab]:.3e}" for lab in labels),
            f"measured = the run's {c['precision']} gradient; ratio vs float64 at eps={ref}; dtheta0 = -lr g/(|g|+eps) "
            "at the group's lr; 'optimizer' = the actual step-0 displacement"]
    cols = ["param", "lr"] + [f"f64 eps={lab}" for lab in labels] + \
        ["measured", "meas/f64", "dtheta0 f64", "dtheta0 meas", "optimizer"]
    rows = [cols]
    for name, fam in result["families"].items():
        for i, g in enumerate(fam["measured"]):
            disp = fam["displacement"]
            rows.append([f"{name}[{i}]", f"{fam['lr']:g}"] + [f"{fam['float64'][lab][i]:+.3e}" for lab in labels]
                        + [f"{g:+.3e}", f"{fam['ratio'][ref][i]:+.2e}", f"{disp['float64'][ref][i]:+.4f}",
                           f"{disp['measured_predicted'][i]:+.4f}", f"{disp['optimizer'][i]:+.4f}"])
    widths = [max(len(r[j]) for r in rows) for j in range(len(cols))]
    lines = ["  ".join(v.rjust(w) if j else v.ljust(w) for j, (v, w) in enumerate(zip(r, widths))) for r in rows]
    paper = result["paper"]
    if paper is not None:
        where = ("the paper's protocol" if result["protocol_matches"] else
                 "NOT the paper's protocol (d6, ClimbMix, compiled bf16 on a GPU): compare in kind, not value")
        fams = result["families"]
        meas = {k: fams[n]["measured"][0] for k, n in (("x0_wte_lambdas", "x0_lambdas"), ("out_lambdas", "out_lambdas"))
                if n in fams}
        lines.append(f"paper (seed 002 §4.5 item 2, seed {c['seed']}) vs measured, {where}:")
        for lab in labels:
            if lab in paper["dL_dalpha"]:
                lines.append(f"  float64 dL/dalpha eps={lab}: paper {paper['dL_dalpha'][lab]:+.3e}, "
                             f"measured {result['dL_dalpha'][lab]:+.3e}")
        for k, v in meas.items():
            lines.append(f"  {c['precision']} grad {k}: paper (bf16) {paper[k]:+.3e}, measured {v:+.3e}")
        if "x0_lambdas" in fams and ref in labels:
            lines.append(f"  {c['precision']}/true ratio (eps={ref}): paper (bf16) {paper['ratio']:+.1e}, "
                         f"measured {fams['x0_lambdas']['ratio'][ref][0]:+.1e}")
    failed = [ch for ch in result["checks"] if not ch["passed"]]
    lines.append(f"checks: {len(result['checks']) - len(failed)}/{len(result['checks'])} passed")
    lines += [f"  {'ok    ' if ch['passed'] else 'FAILED'} {ch['check']}: {ch['detail']}" for ch in result["checks"]]
    return "\n".join(head + lines)


COMMAND = Command(
    'step0', "seed 002 §4.5 item 2 step-0 precision and epsilon audit of a run's real initialisation and step-0 batch",
    options=STEP0_RUN_OPTIONS,
    run=lambda a: run_step0_audit(**cli_args(a)),
    format=format_step0_table)
