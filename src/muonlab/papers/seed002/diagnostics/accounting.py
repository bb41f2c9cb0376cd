"""Per-arm parameter, FLOP and memory accounting of seed paper 002 (§3, Table 1b),
derived from the arm's own model and optimizer, with the paper's printed values beside and each
difference named (issue 16: no constant fitted to a printed number).

Derived on the meta device (no memory, no data, no training), from preset + the arm's overrides:
- Parameters: backbone = `num_scaling_params()["total"]` (result.json's num_params); the OE tables
  counted apart (`oe_tables`), as seed 002 §3 item 1.
- Step FLOPs: `estimate_flops()` x tokens per step (6 N_matmul + sum_l 12 H D_h min(w_l, T): the
  autoresearch count the paper's percentages divide by).
- Extra FLOPs per optimizer step: one training step counted op by op (`FlopCounter`) minus the same
  step of the preset's plain model (no overrides: 00_dense_native). A step is the accumulation
  micro-steps (the family's micro-step hooks, e.g. the OE visit counts, then forward and backward)
  and one optimizer step (`measure_step`).
- Components: the arm's overrides are taken away a section at a time (`OTHER` first, then
  `COMPONENTS` in order); a component costs the step before minus the step after its removal, so
  the components sum to the arm's extra exactly. Each is split into forward/backward and optimizer
  FLOPs (over_encoding's two parts are §3 item 2's OE "lookup" and "update").
- Memory: persistent = parameters + gradients (param dtype) + optimizer state after one step +
  buffers (e.g. OE visit counts), minus the plain model's (Table 1b's "analytical memory");
  activations = bytes of the unique storages autograd saves for backward in one micro-step.

Counting convention (a TorchDispatchMode over aten ops, `op_flops`): matmul [m,k]x[k,n] 2mkn (+mn
for addmm's add); pointwise arithmetic 1 per output element (lerp 3, addcmul / addcdiv 2);
reductions 1 per input element (+1 per output for mean; norms 2 per input + 1 per output); softmax 5
and its backward 4 per element; scatter-adds (embedding backward, index_add) 1 per added element;
views, copies, casts, gathers, creation, comparisons 0. Integer arithmetic counts (§3 item 2 prices the OE
hash as "index arithmetic"). An op with no rule is listed (`uncounted_ops`), never priced silently.

Choices (the paper is silent, or the meta device cannot know):
- Visited rows: the OE update and table-Neumann act on the rows visited in the step (`nonzero`,
  data-dependent): `visited_rows` per table (--visited-rows), default every row, the upper bound
  (the paper prices the OE update "over at most 603,432 rows"). For table-Neumann the output gives
  the row count at which the derived cost equals the paper's figure.
- The optimizer step counted is the first (lazy state creation costs 0 FLOPs; the homotopy ramps
  change values, not operations); param groups update apart, so each is counted once per
  signature. Forward/backward counts are shared by configurations that differ only in "optim.*".
- Activations: eager autograd at the model's own dtypes, no autocast (meta has none); the paper's
  measured peaks are compiled bf16 runs on an RTX 4090, which save less.

Printed values: Table 1b per arm (params, extra GFLOPs and % of step, analytical and measured
memory) and the §3 item 2 component figures, at gpu-d6 / gpu-d8 for seed-002 arms, as printed (strings:
their precision decides agreement). A routing component's printed value is implied by Table 1b
(the arm's total minus its routing-free reference's). Each pair carries the difference (absolute,
relative) and, where they disagree, why (`REASONS`).
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from muonlab.settings import integer_at_least
from muonlab.arms import ARMS, get_arm
from muonlab.config import all_presets, build_config
from muonlab.errors import UsageError
from muonlab.diagnostics import Command

MIB = 2 ** 20
aten = torch.ops.aten

# ---------------------------------------------------------------------------------------------------
# the op counter


_MATMUL = {"mm": 0, "bmm": 0, "mv": 0, "dot": 0, "matmul": 0, "addmm": 1, "baddbmm": 1, "addbmm": 1, "addmv": 1}
_POINTWISE = {**dict.fromkeys(
    "add sub rsub mul div neg pow sqrt rsqrt exp exp2 expm1 log log1p log2 tanh sigmoid relu abs reciprocal "
    "clamp clamp_min clamp_max maximum minimum remainder fmod sign sin cos square threshold_backward "
    "floor_divide".split(), 1),
    "lerp": 3, "addcmul": 2, "addcdiv": 2, "tanh_backward": 2, "sigmoid_backward": 3}
_REDUCE = {"sum": (1, 0), "mean": (1, 1), "amax": (1, 0), "amin": (1, 0), "prod": (1, 0),
           "linalg_vector_norm": (2, 1), "norm": (2, 1)}  # (per input element, per output element)
_SOFTMAX = {"_softmax": 5, "_safe_softmax": 5, "_log_softmax": 5,
            "_softmax_backward_data": 4, "_log_softmax_backward_data": 4}
_SCATTER = {"embedding_dense_backward": 0, "index_add": 3, "scatter_add": 3}  # which arg is added
_FREE = frozenset(
    "view _unsafe_view reshape expand permute transpose t squeeze unsqueeze slice select split "
    "split_with_sizes unbind chunk narrow as_strided alias detach lift_fresh contiguous clone copy "
    "_to_copy cat stack index_select gather embedding index index_copy index_put slice_backward "
    "select_backward constant_pad_nd tril triu eq ne gt ge lt le logical_and logical_or logical_not "
    "bitwise_and bitwise_or bitwise_not where masked_fill nonzero _local_scalar_dense zero fill zeros "
    "ones empty empty_like empty_strided full zeros_like ones_like full_like new_zeros new_ones new_empty "
    "new_full arange scalar_tensor _record_function_enter_new _record_function_exit set resize "
    "nll_loss_backward".split())


def _numel(x) -> int:
    if torch.is_tensor(x):
        return x.numel()
    if isinstance(x, (list, tuple)):
        return sum(_numel(v) for v in x)
    return 0


def op_flops(name: str, args: tuple, out: Any) -> int | None:
    """FLOPs of one aten op under the module's convention; None when the op has no rule."""
    foreach = name.startswith("_foreach_")
    base = name.removeprefix("_foreach_").rstrip("_") or name
    n_out = _numel(out) if out is not None else _numel(args[0])
    if base in _MATMUL:
        if foreach:
            return None
        a = args[_MATMUL[base]]
        k = a.numel() if base == "dot" else a.shape[-1]
        return 2 * k * n_out + (n_out if _MATMUL[base] else 0)
    if base in _POINTWISE:
        return _POINTWISE[base] * n_out
    if base in _REDUCE:
        per_in, per_out = _REDUCE[base]
        return per_in * _numel(args[0]) + per_out * n_out
    if base == "nll_loss_forward":  # pick each target's log-probability (free), sum them
        return args[1].numel()
    if base in _SOFTMAX:
        return _SOFTMAX[base] * n_out
    if base in _SCATTER:
        return _numel(args[_SCATTER[base]])
    if base == "index_put" and len(args) > 3 and args[3]:  # accumulate=True: a scatter-add
        return _numel(args[2])
    if base in _FREE or name in _FREE:
        return 0
    return None


class FlopCounter(TorchDispatchMode):
    """Counts FLOPs (`op_flops`) of every aten op run inside it, per `bucket`.

    On the meta device `nonzero` has no data: a 1-D mask of n entries is taken to have
    min(n, visited_rows) nonzero entries (all of them when visited_rows is None).
    """

    def __init__(self, visited_rows: int | None = None):
        super().__init__()
        self.visited_rows = visited_rows
        self.bucket = "total"
        self.flops: Counter = Counter()
        self.uncounted: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten.nonzero.default and args[0].is_meta:
            mask = args[0]
            rows = mask.numel() if self.visited_rows is None else min(mask.numel(), self.visited_rows)
            return torch.empty((rows, mask.dim()), dtype=torch.long, device="meta")
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        flops = op_flops(name, args, out)
        if flops is None:
            self.uncounted[name] += 1
        else:
            self.flops[self.bucket] += flops
        return out


# ---------------------------------------------------------------------------------------------------
# one counted training step of a configuration (the preset plus some of an arm's overrides)

# (override section, component) in removal order; keys in no section are "other" (removed first)
COMPONENTS = (("model.routing", "routing"), ("model.qk", "q_tau"), ("optim.table_whiten", "table_neumann"),
              ("model.oe", "over_encoding"), ("optim.whiten", "neumann_gram"), ("optim.prepolar", "prepolar"))
OTHER = "other"


def _section(key: str) -> str:
    return next((name for section, name in COMPONENTS if key.startswith(section + ".")), OTHER)


def _storages_bytes(tensors, exclude: frozenset | set = frozenset()) -> int:
    """Bytes of the unique storages behind `tensors` (views share one), less those in `exclude`."""
    seen: dict[int, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        if s._cdata not in exclude:
            seen[s._cdata] = s.nbytes()
    return sum(seen.values())


_FWD_BWD: dict[tuple, dict[str, Any]] = {}  # by (preset, the overrides outside "optim.")
_GROUPS: dict[tuple, tuple[int, int, Counter]] = {}  # a param group's (FLOPs, state bytes, uncounted)


def _count_fwd_bwd(cfg, model, hooks) -> dict[str, Any]:
    """Forward + backward FLOPs of one optimizer step (its micro-steps), the bytes one micro-step saves
    for backward, and the parameters that get a gradient (the model keeps them)."""
    tr = cfg.train
    accum = tr.total_batch_size // (tr.device_batch_size * tr.sequence_len)
    x = torch.zeros(tr.device_batch_size, tr.sequence_len, dtype=torch.long, device="meta")
    weights = {t.untyped_storage()._cdata for t in (*model.parameters(), *model.buffers())}
    saved: list[torch.Tensor] = []
    counter = FlopCounter()
    with counter:
        with torch.no_grad():  # first calls fill caches (the attention masks): priced in no configuration
            model(x)
        counter.bucket = "micro_step"
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            for hook in hooks:
                hook.before_micro_step(x)
            logits = model(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), x.view(-1))
        loss.backward()
    with_grad = [(n, p) for n, p in model.named_parameters() if p.grad is not None]
    added = sum(p.numel() for _, p in with_grad)  # every later micro-step adds into the gradients
    return dict(flops=accum * counter.flops["micro_step"] + (accum - 1) * added, grads=[n for n, _ in with_grad],
                activation_bytes=_storages_bytes(saved, weights), uncounted=counter.uncounted)


def _optimizer_step(optimizer, visited_rows: int | None) -> tuple[int, int, Counter]:
    """FLOPs and state bytes of one optimizer step, a param group at a time (groups update apart), each
    group counted once per signature (options, parameter shapes and dtypes). The first step prices as
    any later one: its lazy state is creation (0 FLOPs); the homotopy ramps change values, not ops."""
    groups, flops, state_bytes, uncounted = optimizer.param_groups, 0, 0, Counter()
    try:
        for g in groups:
            key = (repr(sorted((k, repr(v)) for k, v in g.items() if k != "params")), visited_rows,
                   tuple((tuple(p.shape), p.dtype, p.grad is not None) for p in g["params"]))
            if key not in _GROUPS:
                optimizer.param_groups = [g]
                counter = FlopCounter(visited_rows)
                with counter:
                    optimizer.step()
                state = [v for p in g["params"] for v in optimizer.state.get(p, {}).values() if torch.is_tensor(v)]
                _GROUPS[key] = (counter.flops["total"], _storages_bytes(state), counter.uncounted)
            flops += _GROUPS[key][0]
            state_bytes += _GROUPS[key][1]
            uncounted.update(_GROUPS[key][2])
    finally:
        optimizer.param_groups = groups
    return flops, state_bytes, uncounted


@functools.lru_cache(maxsize=None)
def _measure(preset: str, overrides: tuple, visited_rows: int | None) -> dict[str, Any]:
    """One training step of preset + overrides on the meta device: FLOPs (forward/backward, optimizer),
    persistent and activation bytes, and the model's parameter counts and estimate_flops."""
    from muonlab.device import Runtime
    from muonlab.families import get_family
    from muonlab.train.build import build_model, build_optimizer

    if preset not in all_presets():
        raise UsageError(f"unknown preset {preset!r}; choose from {', '.join(all_presets())}")
    cfg = build_config([("preset", all_presets()[preset]), ("arm", dict(overrides))])
    if cfg.family != "autoresearch":
        raise UsageError(f"accounting prices autoresearch-family arms (seed 002's GPT); preset {preset} is "
                         f"{cfg.family}")
    model = build_model(cfg, cfg.data.vocab_size, Runtime(torch.device("meta"), "bf16"))  # bf16 tables, as on GPU
    model.train()
    key = (preset, tuple(kv for kv in overrides if not kv[0].startswith("optim.")))
    if key not in _FWD_BWD:
        hooks = [h for h in get_family(cfg.family).step_hooks(cfg, model) if hasattr(h, "before_micro_step")]
        _FWD_BWD[key] = _count_fwd_bwd(cfg, model, hooks)
    else:  # the same model: its gradients as the counted backward left them
        params = dict(model.named_parameters())
        for name in _FWD_BWD[key]["grads"]:
            params[name].grad = torch.zeros_like(params[name])
    fb = _FWD_BWD[key]
    flops, state_bytes, uncounted = _optimizer_step(build_optimizer(model, cfg, compile_step=False), visited_rows)
    grads = [p for p in model.parameters() if p.grad is not None]
    persistent = (_storages_bytes(model.parameters()) + sum(p.numel() * p.element_size() for p in grads)
                  + state_bytes + _storages_bytes(model.buffers()))
    return dict(fwd_bwd=fb["flops"], optimizer=flops, persistent_bytes=persistent,
                activation_bytes=fb["activation_bytes"], uncounted=dict(fb["uncounted"] + uncounted),
                counts=model.num_scaling_params(), per_token=model.estimate_flops(),
                oe_rows=list(model.oe.rows) if hasattr(model, "oe") else [],
                tokens=cfg.train.total_batch_size, depth=cfg.model.depth, n_embd=cfg.model.model_dim)


def measure_step(preset: str, overrides: dict | None = None, visited_rows: int | None = None) -> dict[str, Any]:
    """One training step of `preset` with `overrides` (dotted run-config keys), counted on the meta
    device: "fwd_bwd" and "optimizer" FLOPs, "persistent_bytes", "activation_bytes", the model's
    parameter "counts" and "per_token" (estimate_flops)."""
    return _measure(preset, _key(overrides or {}), visited_rows)


def _key(overrides: dict) -> tuple:
    return tuple(sorted(overrides.items()))


def _chain(overrides: dict) -> list[tuple[str, dict]]:
    """(component removed, the overrides left) in removal order, ending with none left."""
    out, left = [], dict(overrides)
    for name in (OTHER, *(n for _, n in COMPONENTS)):
        if any(_section(k) == name for k in left):
            left = {k: v for k, v in left.items() if _section(k) != name}
            out.append((name, dict(left)))
    return out


def _label(name: str, overrides: dict) -> str:
    """The component's name in the output (pre-polar by its kind: "bieq" for seed 002's HBiEq)."""
    if name != "prepolar":
        return name
    kind = overrides.get("optim.prepolar.kind")
    return "bieq" if kind == "hbieq" else f"prepolar_{kind}"


# ---------------------------------------------------------------------------------------------------
# what the paper printed (seed 002 §3 item 2 and Table 1b), as printed


PAPER_PRESETS = ("gpu-d6", "gpu-d8")  # seed 002's depth-6 and depth-8 protocols
PAPER_STEP_TFLOPS = {"gpu-d6": "59.37", "gpu-d8": "125.35"}  # §3 item 2 ("of the 59.37 TFLOPs step")
# §3 item 2, per component: (forward/backward part, optimizer part) where the paper prints one; "other"
# (PE32, momentum cooldown, cosine WD, MASTER32, LR141, step-0 modes) is 0: its optimizer total is BiEq + NG
PAPER_COMPONENTS = {
    "gpu-d6": {"over_encoding": ("1.6106", "0.2896"), "bieq": (None, "0.1695"), "neumann_gram": (None, "24.3820"),
               "q_tau": ("4.8318", None), "table_neumann": (None, "19.37"), OTHER: ("0", "0")},
    "gpu-d8": {"over_encoding": ("2.1475", "0.3862"), "bieq": (None, "0.4027"), "neumann_gram": (None, "51.8967"),
               "q_tau": ("8.5899", None), "table_neumann": (None, "34.13"), OTHER: ("0", "0")},
}
# Table 1b: backbone, OE, total params; extra GFLOPs/step, % of step; analytical memory Δ MiB; measured peak Δ MiB
_T1B_ROWS = """
gpu-d6 00_dense_native 26,345,772 0 26,345,772 0.00 0.000 0.00 0.0
gpu-d6 01_dense_opt 26,345,772 0 26,345,772 24.55 0.041 96.00 96.0
gpu-d6 02_dense_joint 26,346,924 0 26,346,924 29.38 0.049 96.02 96.0
gpu-d6 02m_dense_masked_qk 26,346,924 0 26,346,924 29.38 0.049 96.02 96.0
gpu-d6 10_oe_native 26,345,772 57,929,472 84,275,244 1.90 0.003 223.29 227.3
gpu-d6 11_oe_opt 26,345,772 57,929,472 84,275,244 26.45 0.045 319.29 323.3
gpu-d6 12_oe_joint 26,346,924 57,929,472 84,276,396 31.28 0.053 319.31 323.3
gpu-d6 12m_oe_masked_qk 26,346,924 57,929,472 84,276,396 31.28 0.053 319.31 323.3
gpu-d6 3a_oe_table_neumann_native 26,345,772 57,929,472 84,275,244 21.27 0.036 223.29 227.3
gpu-d6 00_dense_native_lr141 26,345,772 0 26,345,772 0.00 0.000 0.00 0.0
gpu-d6 01_dense_opt_lr141 26,345,772 0 26,345,772 24.55 0.041 96.00 96.0
gpu-d6 02_dense_joint_lr141 26,346,924 0 26,346,924 29.38 0.049 96.02 96.0
gpu-d6 12d_oe_decoupled_x0 26,346,930 57,929,472 84,276,402 36.92 0.062 319.31 419.8
gpu-d6 12do_oe_decoupled_x0_out 26,346,932 57,929,472 84,276,404 38.53 0.065 319.31 419.8
gpu-d6 12do_nostep0 26,346,932 57,929,472 84,276,404 38.53 0.065 319.31 419.8
gpu-d6 12do_mom_only_nodisp 26,346,932 57,929,472 84,276,404 38.53 0.065 319.31 419.8
gpu-d6 12do_disp_only_nomom 26,346,932 57,929,472 84,276,404 38.53 0.065 319.31 419.8
gpu-d6 12do_disp_stepcount_nomom 26,346,932 57,929,472 84,276,404 38.53 0.065 319.31 419.8
gpu-d6 12do_nostep0_all 26,346,932 57,929,472 84,276,404 38.53 0.065 319.31 419.8
gpu-d6 12do_shared_denom 26,346,932 57,929,472 84,276,404 37.32 0.063 319.31 419.3-419.8
gpu-d6 12do_shared_denom_f32eps 26,346,932 57,929,472 84,276,404 37.32 0.063 319.31 419.3-419.8
gpu-d8 00_dense_native 50,332,176 0 50,332,176 0.00 0.000 0.00 0.0
gpu-d8 01_dense_opt 50,332,176 0 50,332,176 52.30 0.042 160.00 160.0
gpu-d8 02_dense_joint 50,334,224 0 50,334,224 60.89 0.049 160.03 160.0
gpu-d8 10_oe_native 50,332,176 77,239,296 127,571,472 2.53 0.002 296.95 300.9
gpu-d8 11_oe_opt 50,332,176 77,239,296 127,571,472 54.83 0.044 456.95 460.9
gpu-d8 12_oe_joint 50,334,224 77,239,296 127,573,520 63.42 0.051 456.98 460.9
gpu-d8 12m_oe_masked_qk 50,334,224 77,239,296 127,573,520 63.42 0.051 456.98 460.9
gpu-d8 4a_12_oe_joint_bf16state 50,334,224 77,239,296 127,573,520 63.42 0.051 296.98 300.9
gpu-d8 12d_oe_decoupled_x0_bf16state 50,334,232 77,239,296 127,573,528 73.09 0.058 296.98 429.4
gpu-d8 12do_oe_decoupled_x0_out_bf16state 50,334,234 77,239,296 127,573,530 75.23 0.060 296.98 429.4
gpu-d8 12d_bf16_shared_denom 50,334,232 77,239,296 127,573,528 71.48 0.057 296.98 428.9
"""
T1B_FIELDS = ("backbone", "oe", "total", "extra_gflops", "pct_of_step", "memory_mib", "peak_mib")
PAPER_TABLE_1B = {(row[0], row[1]): dict(zip(T1B_FIELDS, row[2:]))
                  for row in (line.split() for line in _T1B_ROWS.strip().splitlines())}
# the routing arms' routing-free references in Table 1b (d8 routing arms run BF16 state: #4a)
ROUTING_REFERENCE = {"gpu-d6": "12_oe_joint", "gpu-d8": "4a_12_oe_joint_bf16state"}

# why a derived value differs from the printed one, where it is known (shown with the pair)
REASONS = {
    "step": "not derivable from the model: the paper gives no formula for it, and estimate_flops x N_tok "
            "reproduces its d8 step (125.35 TFLOPs)",
    "extra_gflops": "the sum of the components' differences",
    ("over_encoding", "fwd_bwd"): "the paper prices 8 FLOPs per token-channel; counted: the x0 add and the tables' "
                                  "gradient scatter-add (1 each per token-channel), the dense table gradients' "
                                  "accumulation over the micro-steps, and per token the hash (twice: visit counts "
                                  "and lookup) and the visit counts",
    ("over_encoding", "optimizer"): "priced at {rows} per table; the paper at every row",
    ("bieq", "optimizer"): "the paper prices ~16 FLOPs per Muon-matrix element (our reading of seed 002 §3 item 2's d8 "
                           "figure); muonlab's HBiEq takes both passes from one squared copy by matrix-vector "
                           "products: 11 per element, plus per-row and per-column work",
    ("neumann_gram", "optimizer"): "the paper's rule 4Vd^2+14Vd+3d^2+3d per table has 14 elementwise FLOPs per "
                                   "table entry; the implementation does 4 (mean, centring, scaling, subtraction)",
    ("q_tau", "fwd_bwd"): "the paper's 4 N_tok d L leaves out the per-parameter work of every micro-step "
                          "(exp(q_tau), the two RoPE halves' gradient sum)",
    ("table_neumann", "optimizer"): "visited rows are data-dependent: priced at {rows} per table; the paper's "
                                    "figure is this count at {implied} rows per table",
    ("routing", "total"): "the paper prices 4 FLOPs per routed term and token-channel (our reading of seed 002 §3 item 2 "
                          "of its totals); counted: 6 per term (forward multiply-add; backward the anchor's "
                          "gradient, its accumulation, and the scalar's product and sum) plus the anchor itself",
    "memory_mib": "the paper adds its components rounded to 0.01 MiB",
    "peak_mib": "a measured peak (compiled bf16 run, RTX 4090) holds activations and allocator slack as well "
                "(the eager column: what eager autograd saves; a compiled run saves less)",
}


def _printed(text: str) -> tuple[float, float, float]:
    """(low, high, half a unit in the last printed place) of a printed number or range ('419.3-419.8')."""
    parts = [p.replace(",", "") for p in text.split("-")]
    decimals = len(parts[0].split(".")[1]) if "." in parts[0] else 0
    return float(parts[0]), float(parts[-1]), 0.5 * 10 ** -decimals


def compare(derived: float, printed: str | None, reason: str | None = None) -> dict[str, Any]:
    """A derived value beside the printed one: the difference (from the nearer end of a printed range),
    relative to the printed value, whether they agree at the printed precision, and why not."""
    if printed is None:
        return dict(derived=derived, printed=None)
    low, high, half = _printed(printed)
    ref = low if derived < low else high
    diff = 0.0 if low <= derived <= high else derived - ref
    agrees = abs(diff) <= half * (1 + 1e-9)
    out = dict(derived=derived, printed=printed, difference=diff, relative=diff / ref if ref else None,
               agrees=agrees)
    if not agrees:
        out["reason"] = reason or "unexplained"
    return out


# ---------------------------------------------------------------------------------------------------
# the accounting of an arm


def _implied_rows(preset: str, with_tn: dict, without: dict, printed: str) -> int | None:
    """The visited rows per table at which table-Neumann costs the printed GFLOPs (its count is affine in
    the rows: two row counts fix it)."""
    cost = [(_measure(preset, _key(with_tn), r)["optimizer"] - _measure(preset, _key(without), r)["optimizer"])
            for r in (1_000, 2_000)]
    if cost[1] == cost[0]:
        return None
    return round(1_000 + (float(printed) * 1e9 - cost[0]) * 1_000 / (cost[1] - cost[0]))


def routing_printed(arm: str, preset: str) -> tuple[str, str] | None:
    """A routing arm's routing GFLOPs as Table 1b implies them (the paper prints only the range 5.64-7.25 /
    8.05-11.81): its extra GFLOPs minus its routing-free reference's, and where that comes from."""
    ref = ROUTING_REFERENCE.get(preset)
    if (preset, arm) not in PAPER_TABLE_1B or (preset, ref) not in PAPER_TABLE_1B:
        return None
    total, base = PAPER_TABLE_1B[preset, arm]["extra_gflops"], PAPER_TABLE_1B[preset, ref]["extra_gflops"]
    return f"{float(total) - float(base):.2f}", f"Table 1b: {arm} {total} minus {ref} {base}"


def arm_accounting(arm: str, preset: str = "gpu-d8", visited_rows: int | None = None) -> dict[str, Any]:
    """Parameters, per-step FLOPs (and components) and memory of `arm` under `preset`, derived as the
    module docstring says, each beside the paper's printed value where there is one."""
    if visited_rows is not None and visited_rows < 0:
        raise UsageError(f"visited rows must be >= 0, got {visited_rows}")
    if preset not in all_presets():
        raise UsageError(f"unknown preset {preset!r}; choose from {', '.join(all_presets())}")
    spec = get_arm(arm)
    overrides = dict(spec.overrides)
    here, plain = _measure(preset, _key(overrides), visited_rows), _measure(preset, (), visited_rows)
    paper = spec.paper == "seed 002" and preset in PAPER_PRESETS
    t1b = PAPER_TABLE_1B.get((preset, arm), {}) if paper else {}
    rows_text = "every row" if visited_rows is None else f"{visited_rows:,} rows"

    counts = here["counts"]
    params = dict(backbone=counts["total"], oe=counts.get("oe_tables", 0), breakdown=dict(counts),
                  oe_table_rows=here["oe_rows"])
    params["total"] = params["backbone"] + params["oe"]
    params["compare"] = {k: compare(params[k], t1b.get(k)) for k in ("backbone", "oe", "total")}

    components, before, uncounted = {}, here, Counter(here["uncounted"])
    for name, left in _chain(overrides):
        after = _measure(preset, _key(left), visited_rows)
        label = _label(name, overrides)
        comp = dict(settings={k: v for k, v in overrides.items() if _section(k) == name},
                    fwd_bwd=(before["fwd_bwd"] - after["fwd_bwd"]) / 1e9,
                    optimizer=(before["optimizer"] - after["optimizer"]) / 1e9,
                    persistent_mib=(before["persistent_bytes"] - after["persistent_bytes"]) / MIB,
                    activation_mib=(before["activation_bytes"] - after["activation_bytes"]) / MIB)
        comp["total"] = comp["fwd_bwd"] + comp["optimizer"]
        printed = PAPER_COMPONENTS[preset].get(label) if paper else None
        if printed:
            cmp = {}
            for part, text in zip(("fwd_bwd", "optimizer"), printed):
                if text is None:
                    continue
                reason = REASONS.get((label, part), "")
                if "{implied}" in reason:
                    implied = _implied_rows(preset, {**left, **comp["settings"]}, left, text)
                    reason = reason.format(rows=rows_text, implied="unknown" if implied is None else f"{implied:,}")
                cmp[part] = compare(comp[part], text, reason.format(rows=rows_text) or None)
            comp["compare"] = cmp
        elif label == "routing" and paper and (implied := routing_printed(arm, preset)):
            comp["compare"] = {"total": dict(compare(comp["total"], implied[0], REASONS[("routing", "total")]),
                                             printed_from=implied[1])}
        components[label] = comp
        uncounted.update(after["uncounted"])
        before = after

    step = here["per_token"] * here["tokens"]
    extra = (here["fwd_bwd"] + here["optimizer"] - plain["fwd_bwd"] - plain["optimizer"]) / 1e9
    step_printed = PAPER_STEP_TFLOPS[preset] if paper else None
    step_cmp = compare(step / 1e12, step_printed, REASONS["step"])
    pct = 100 * extra * 1e9 / step
    flops = dict(per_token=here["per_token"], tokens_per_step=here["tokens"], step_tflops=step / 1e12,
                 extra_gflops=extra, pct_of_step=pct, components=components, visited_rows=visited_rows,
                 uncounted_ops=dict(uncounted))
    pct_reason = "follows the extra GFLOPs" + ("" if step_cmp.get("agrees", True) else
                                               f"; the paper divides by its {step_printed} TFLOPs step")
    flops["compare"] = dict(step_tflops=step_cmp, extra_gflops=compare(extra, t1b.get("extra_gflops"),
                                                                       REASONS["extra_gflops"]),
                            pct_of_step=compare(pct, t1b.get("pct_of_step"), pct_reason))
    if step_printed:
        flops["pct_of_printed_step"] = 100 * extra * 1e9 / (float(step_printed) * 1e12)

    persistent = (here["persistent_bytes"] - plain["persistent_bytes"]) / MIB
    activations = (here["activation_bytes"] - plain["activation_bytes"]) / MIB
    parts = {name: round(c["persistent_mib"], 2) for name, c in components.items() if round(c["persistent_mib"], 2)}
    terms = " + ".join(f"{name} {v:.2f}" for name, v in parts.items())
    summed = t1b.get("memory_mib") is not None and f"{sum(parts.values()):.2f}" == t1b["memory_mib"]
    memory_reason = (f"{REASONS['memory_mib']}: {terms}" if summed else
                     f"the components differ from the paper's, rounded: {terms or 'none'}")
    memory = dict(persistent_mib=persistent, activation_mib=activations, compare=dict(
        persistent_mib=compare(persistent, t1b.get("memory_mib"), memory_reason),
        peak_mib=compare(persistent, t1b.get("peak_mib"), REASONS["peak_mib"])))
    return dict(arm=arm, preset=preset, depth=here["depth"], n_embd=here["n_embd"], params=params, flops=flops,
                memory=memory)


def accounting_table(arms: list[str], preset: str, visited_rows: int | None = None) -> dict[str, Any]:
    """`arm_accounting` of each arm under one preset."""
    if visited_rows is not None:
        from muonlab.arms import resolve_config

        if not any(resolve_config(arm, preset, {}).model.oe.m > 0 for arm in arms):
            raise UsageError("--visited-rows prices the Over-Encoding tables' updates; none of these arms has them")
    rows = [arm_accounting(arm, preset, visited_rows) for arm in arms]
    first = rows[0]["flops"]["compare"]["step_tflops"] if rows else {}
    return dict(preset=preset, step_tflops=first.get("derived"), paper_step_tflops=PAPER_STEP_TFLOPS.get(preset),
                visited_rows=visited_rows, rows=rows)


# ---------------------------------------------------------------------------------------------------
# Markdown


def _pair(c: dict[str, Any] | None, fmt: str = "{:.2f}") -> str:
    """'derived', 'derived [=]' (agrees with the printed value) or 'derived [paper P, difference, relative]'."""
    if c is None:
        return "—"
    text = fmt.format(c["derived"])
    if c.get("printed") is None:
        return text
    if c["agrees"]:
        return f"{text} [=]"
    rel = "" if c["relative"] is None else f", {100 * c['relative']:+.1f} %"
    return f"{text} [paper {c['printed']}, {c['difference']:+.4g}{rel}]"


def format_accounting_table(result: dict[str, Any]) -> str:
    """Per arm, then per distinct component: derived [=] or [paper P, derived - P, relative]; the named
    differences last."""
    rows, visited = result["rows"], result.get("visited_rows")
    step = rows[0]["flops"]["compare"]["step_tflops"] if rows else None
    notes: dict[tuple[str, str], list[str]] = {}  # (what, reason) -> the arms it is about, in order

    def note(label: str, c: dict[str, Any] | None, arm: str | None = None) -> None:
        if c and c.get("reason"):
            arms = notes.setdefault((label, c["reason"]), [])
            if arm and arm not in arms:
                arms.append(arm)

    note("step", step)
    out = [f"preset {result['preset']}: step {_pair(step, '{:.3f}')} TFLOPs (estimate_flops x N_tok); OE visited "
           f"rows per table: {'every row (the upper bound)' if visited is None else f'{visited:,}'}",
           "derived [=]: agrees with the paper at its printed precision; [paper P, derived - P, relative]: differs",
           "", "| arm | params: backbone + OE = total | extra GFLOPs/step | % of step | persistent Δ MiB "
           "| vs measured peak Δ MiB | eager activations Δ MiB |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        pc, fc, mc = r["params"]["compare"], r["flops"]["compare"], r["memory"]["compare"]
        peak = _pair(mc["peak_mib"], "{:.1f}") if mc["peak_mib"]["printed"] else "—"
        out.append(f"| {r['arm']} | {_pair(pc['backbone'], '{:,}')} + {_pair(pc['oe'], '{:,}')} = "
                   f"{_pair(pc['total'], '{:,}')} | {_pair(fc['extra_gflops'])} | "
                   f"{_pair(fc['pct_of_step'], '{:.3f}')} | {_pair(mc['persistent_mib'])} | {peak} "
                   f"| {r['memory']['activation_mib']:+.2f} |")
        for key in ("extra_gflops", "pct_of_step"):
            note(key, fc[key])
        note("persistent memory", mc["persistent_mib"], r["arm"])
        note("measured peak", mc["peak_mib"])
        if r["flops"]["uncounted_ops"]:
            ops = ", ".join(sorted(r["flops"]["uncounted_ops"]))
            note("ops with no FLOP rule (priced 0)", dict(reason=ops), r["arm"])
    components: dict[tuple, list[str]] = {}  # (component, settings, cells) -> the arms that have it
    for r in rows:
        for name, c in r["flops"]["components"].items():
            cmp = c.get("compare", {})
            if "total" in cmp:  # printed as one figure (routing: implied by Table 1b)
                cells = f"{_pair(cmp['total'], '{:.4f}')} (total) | —"
            else:
                cells = " | ".join(_pair(cmp.get(part) or dict(derived=c[part]), "{:.4f}")
                                   for part in ("fwd_bwd", "optimizer"))
            settings = ", ".join(f"{k.split('.', 1)[1]}={v}" for k, v in sorted(c["settings"].items()))
            key = (name, settings, f"{cells} | {c['persistent_mib']:+.2f} | {c['activation_mib']:+.2f}")
            components.setdefault(key, []).append(r["arm"])
            for part, v in cmp.items():
                note(f"{name} {part}", v)
    out += ["", "| component (settings) | arms | fwd+bwd GFLOPs | optimizer GFLOPs | persistent Δ MiB "
                "| eager activations Δ MiB |", "|---|---|---|---|---|---|"]
    out += [f"| {name} ({settings}) | {', '.join(arms)} | {cells} |"
            for (name, settings, cells), arms in components.items()]
    if notes:
        out += ["", "differences:"]
        for (label, reason), arms in notes.items():
            out.append(f"- {label} ({', '.join(arms)}): {reason}" if arms else f"- {label}: {reason}")
    return "\n".join(out)


def accounting_arms(args) -> list[str]:
    """--arms, or every seed-002 arm (seed 002 §2.2, Table 1)."""
    if args.arms is not None:
        names = [name.strip() for name in args.arms.split(",") if name.strip()]
        if not names:
            raise UsageError("--arms names at least one arm (leave it out for every seed-002 arm)")
        return [get_arm(name).name for name in names]
    return [name for name, arm in ARMS.items() if arm.paper == "seed 002"]


COMMAND = Command(
    'accounting', "FLOP, parameter and memory accounting per arm, derived from the "
    "arm's model and optimizer, beside seed 002's printed values (§3, Table 1b)",
    options=(("--arms", dict(default=None, help="comma-separated arms (default: every seed-002 arm)")),
        ("--preset", dict(default="gpu-d8", help="the protocol the arms are priced at (default gpu-d8)")),
        ("--visited-rows", dict(type=integer_at_least(0), default=None, metavar="N",
        help="OE rows visited per table in a step (data-dependent; default "
        "every row, the upper bound)"))),
    run=lambda a: accounting_table(accounting_arms(a), a.preset, a.visited_rows),
    format=format_accounting_table)
