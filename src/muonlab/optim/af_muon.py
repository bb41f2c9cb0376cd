"""AF-Muon: AdamW-free Muon for tied-embedding models (seed paper 004; §2, §3.1).

Every unique parameter gets one role (§2.2, Algorithm 1). "matrix": Muon with the quintic Newton–Schulz of
§2.2 (muonlab.optim.polar.newton_schulz, beside upstream's Polar Express). "tied": the one table that is both input embedding and output head; heavy-ball momentum
on the merged gradient and the row-wise clipped-row LMO (§2.2 eqs. 4–5, `muonlab.optim.lmo`), with
lr_tie = lr * rho * s / d (eq. 6; rho = rho_out/rho_hid). "vector" (ndim <= 1): heavy-ball
momentum and b / max(RMS(b), eps) (§2.2). One fp32 buffer per tensor, no second moment, no bias
correction, no decay outside "matrix". Baselines (§3.1) are presets of `build_optimizer`.

Choices (ours, where the spec leaves room):
- A fourth role "adamw" (torch.optim.AdamW's single-tensor arithmetic, state exp_avg/exp_avg_sq/
  step) exists only so that the Hybrid and factorial baselines are one Optimizer (one state_dict,
  schedulers work); AF-Muon presets never use it. Every group carries "part" (its partition role).
- Momenta are written as mul/add (M = mu M + (1-mu) G; Z = (1-mu) G + mu M), not lerps.
- newton_schulz returns bf16 without the shape factor; the step multiplies by
  sqrt(max(1, rows/cols)) and adds the bf16 update into the fp32 parameter. 3-D tensors are a
  stack of matrices (orthogonalised one by one); >= 4-D tensors are flattened to (shape[0], -1).
- Nonzero weight_decay on a "tied" or "vector" group is an error (the paper decays matrices only).
- The partition walks trainable parameters only. An nn.Linear of shape (V, d) that is not the
  table is an untied head -> error. `matrices="all"` sends every other >= 2-D tensor to Muon
  (T5Gemma2 runner rule); raw 2-D parameters named "*router*" are matrices in either mode. All
  presets share this partition, so a model the AF rule rejects is rejected by every arm.
- "sign" fixes cap = 1 (s defaults to 1); "adamw" is torch.optim.AdamW (lr 6e-4, wd 0.1, eps 1e-8).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim.optimizer import required

from muonlab.optim.lmo import clipped_row_lmo
from muonlab.optim.polar import newton_schulz

ROLES = ("matrix", "tied", "vector", "adamw")
# the group settings each role's update reads (the others are defaults it carries and ignores)
ROLE_KEYS = {"matrix": ("lr", "momentum", "weight_decay", "ns_steps"),
             "tied": ("lr", "momentum", "cap", "scale", "rho", "d", "chunk_rows"),
             "vector": ("lr", "momentum", "eps"),
             "adamw": ("lr", "betas", "eps", "weight_decay")}
PRESETS = ("afmuon", "hybrid", "sign", "factorial_lmo_rms", "factorial_lmo_adamw",
           "factorial_adamw_rms", "factorial_adamw_adamw", "adamw", "hybrid_untied")
Named = list[tuple[str, nn.Parameter]]


def shape_factor(p: Tensor) -> float:
    """sqrt(max(1, rows/cols)) of the matrix NS sees (rows x cols of the stored weight)."""
    rows, cols = (p.shape[0], p[0].numel()) if p.ndim > 3 else p.shape[-2:]
    return math.sqrt(max(1.0, rows / cols))


DEFAULT_CAP, DEFAULT_SCALE = 3.0, 0.5  # seed 004 §2's c and s (Table 1's AF-Muon)


class AFMuon(torch.optim.Optimizer):
    """AF-Muon (seed 004 §2). Param groups need a "role" in ROLES; see the module docstring."""

    def __init__(self, params: Iterable[Any], *, lr: float = 0.02, momentum: float = 0.95,
                 weight_decay: float = 0.0, ns_steps: int = 5, cap: float = DEFAULT_CAP, scale: float = DEFAULT_SCALE,
                 rho: float = 60.0, d: int | None = None, eps: float = 1e-8, chunk_rows: int | None = None,
                 betas: tuple[float, float] = (0.9, 0.95)) -> None:
        defaults = dict(role=required, part=None, lr=lr, momentum=momentum, weight_decay=weight_decay,
                        ns_steps=ns_steps, cap=cap, scale=scale, rho=rho, d=d, eps=eps,
                        chunk_rows=chunk_rows, betas=betas)
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        g = self.param_groups[-1]
        role = g["role"]
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; expected one of {ROLES}")
        g["part"] = g["part"] or role
        if not 0.0 <= g["momentum"] < 1.0 or g["lr"] < 0 or g["eps"] <= 0 or g["weight_decay"] < 0:
            raise ValueError(f"{role} group: need 0 <= momentum < 1, lr >= 0, eps > 0, weight_decay >= 0")
        if role in ("tied", "vector") and g["weight_decay"] != 0:
            raise ValueError(f"{role} group: AF-Muon decays matrices only (weight_decay must be 0)")
        if role == "tied" and (math.isnan(g["cap"]) or g["cap"] < 1 or g["scale"] < 0 or g["rho"] < 0):
            raise ValueError("tied group: need cap >= 1 (inf allowed), scale >= 0, rho >= 0")
        for p in g["params"]:
            if {"matrix": p.ndim < 2, "tied": p.ndim != 2, "vector": p.ndim > 1, "adamw": False}[role]:
                raise ValueError(f"{role} group got a {p.ndim}-D tensor of shape {tuple(p.shape)}")

    def _state(self, p: Tensor, role: str, like: Tensor | None = None) -> dict[str, Any]:
        """p's state, created shaped like `like` (default p; a row shard under DistAFMuon)."""
        st = self.state[p]
        if not st:
            like = p if like is None else like
            f32 = dict(dtype=torch.float32, memory_format=torch.preserve_format)
            if role == "adamw":
                st.update(step=0, exp_avg=torch.zeros_like(like, **f32), exp_avg_sq=torch.zeros_like(like, **f32))
            else:
                st["momentum_buffer"] = torch.zeros_like(like, **f32)
        return st

    def init_state(self) -> None:
        """Create every parameter's state now (as the first step would); e.g. for memory planning."""
        for g in self.param_groups:
            _ = [self._state(p, g["role"]) for p in g["params"]]

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        with torch.enable_grad():
            loss = closure() if closure is not None else None
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    grad = (p.grad.to_dense() if p.grad.is_sparse else p.grad).float()
                    self._update(g, p, grad, self._state(p, g["role"]))
        return loss

    @staticmethod
    def _update(g: dict[str, Any], p: Tensor, grad: Tensor, st: dict[str, Any]) -> None:
        """One tensor's step in place (p may be a row shard of a table: every rule but "matrix" acts per row
        or per element, and a shard keeps the table's width d for eq. 6)."""
        role, lr, mu = g["role"], g["lr"], g["momentum"]
        if role == "adamw":
            _adamw(p, grad, st, lr, g["betas"], g["eps"], g["weight_decay"])
            return
        buf = st["momentum_buffer"]
        if role == "matrix":
            buf.mul_(mu).add_(grad, alpha=1 - mu)
            O = newton_schulz(grad * (1 - mu) + buf * mu, g["ns_steps"])
            p.mul_(1 - lr * g["weight_decay"])
            p.add_(O.to(p.dtype), alpha=-lr * shape_factor(p))
            return
        buf.mul_(mu).add_(grad)
        if role == "tied":
            U = clipped_row_lmo(buf, g["cap"], chunk_rows=g["chunk_rows"])
            p.add_(U.to(p.dtype), alpha=-tied_lr(lr, g, p))
        else:
            rms = buf.norm() / math.sqrt(buf.numel())
            p.add_((buf / rms.clamp_min(g["eps"])).to(p.dtype), alpha=-lr)


def tied_lr(lr: float, group: dict[str, Any], table: Tensor) -> float:
    """eq. 6: lr_tie = lr_M * (rho_out/rho_hid) * s / d, d = group["d"] or the table's width."""
    return lr * group["rho"] * group["scale"] / (group["d"] or table.shape[1])


def _adamw(p: Tensor, grad: Tensor, st: dict[str, Any], lr: float, betas: tuple[float, float],
           eps: float, wd: float) -> None:
    b1, b2 = betas
    st["step"] += 1
    m, v = st["exp_avg"], st["exp_avg_sq"]
    p.mul_(1 - lr * wd)
    m.lerp_(grad, 1 - b1)
    v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
    denom = (v.sqrt() / math.sqrt(1 - b2 ** st["step"])).add_(eps)
    p.addcdiv_(m.to(p.dtype), denom.to(p.dtype), value=-lr / (1 - b1 ** st["step"]))


def find_tied(model: nn.Module, tied: str | Tensor | None = None) -> tuple[str, nn.Parameter]:
    """(name, table): HF-style get_input/output_embeddings() if present, else `tied` or tied_embedding()."""
    names = {id(p): n for n, p in model.named_parameters()}
    if hasattr(model, "get_input_embeddings") and hasattr(model, "get_output_embeddings"):
        inp, out = model.get_input_embeddings(), model.get_output_embeddings()
        if inp is None or out is None or out.weight is not inp.weight:
            head = names.get(id(getattr(out, "weight", None)), "output head")
            raise ValueError(f"{head}: untied output head; AF-Muon needs "
                             "get_output_embeddings().weight is get_input_embeddings().weight")
        table = inp.weight
    elif tied is not None:
        table = model.get_parameter(tied) if isinstance(tied, str) else tied
    elif hasattr(model, "tied_embedding"):
        table = model.tied_embedding()
    else:
        raise ValueError("no tied table: give get_input/output_embeddings(), `tied=` or tied_embedding()")
    if id(table) not in names or table.ndim != 2:
        raise ValueError("the tied table must be a 2-D parameter of the model")
    return names[id(table)], table


def partition_by_role(model: nn.Module, *, tied: str | Tensor | None = None,
                      matrices: str = "linear") -> dict[str, Named]:
    """Roles of every unique trainable parameter (seed 004 §2.2, Algorithm 1); ValueError names any tensor without one."""
    if matrices not in ("linear", "all"):
        raise ValueError(f"matrices must be 'linear' or 'all', got {matrices!r}")
    tied_name, table = find_tied(model, tied)
    V, d = table.shape
    kind: dict[int, str] = {}
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    for module_name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            # an untied head: the model's declared output embedding, or (no accessor) a (V, d) Linear
            # named like a head; shape alone is not enough (an MLP's d -> 4d can be (V, d) too)
            head = m is out if out is not None else (
                tuple(m.weight.shape) == (V, d) and module_name.rsplit(".", 1)[-1] in ("lm_head", "head", "output"))
            kind.setdefault(id(m.weight), "head" if head else "linear")
        elif isinstance(m, nn.Embedding):
            kind.setdefault(id(m.weight), "embedding")
        elif isinstance(m, nn.MultiheadAttention) and m.in_proj_weight is not None:
            kind.setdefault(id(m.in_proj_weight), "linear")
    roles: dict[str, Named] = {"matrix": [], "tied": [], "vector": []}
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if id(p) in seen or not p.requires_grad:
            continue
        seen.add(id(p))
        k = kind.get(id(p))
        if p is table:
            roles["tied"].append((name, p))
        elif p.ndim <= 1:
            roles["vector"].append((name, p))
        elif k == "embedding":
            raise ValueError(f"{name}: a second embedding table has no AF-Muon role (tied: {tied_name})")
        elif k == "head":
            raise ValueError(f"{name}: an untied output head has no AF-Muon role (tie it to {tied_name})")
        elif k == "linear" or matrices == "all" or (p.ndim == 2 and "router" in name):
            roles["matrix"].append((name, p))
        else:
            raise ValueError(f"{name}: unrecognised {p.ndim}-D tensor {tuple(p.shape)} "
                             "(not an nn.Linear weight) has no AF-Muon role")
    if len(roles["tied"]) != 1:
        raise ValueError(f"expected exactly one trainable tied tensor, found {len(roles['tied'])}")
    return roles


_BUILD = dict(lr=0.02, vector_lr=3e-4, momentum=0.95, weight_decay=0.1, ns_steps=5, cap=DEFAULT_CAP, scale=DEFAULT_SCALE,
              rho=60.0, eps=1e-8, chunk_rows=None, aux_lr=3e-4, aux_betas=(0.9, 0.95), aux_eps=1e-10,
              aux_weight_decay=0.0, tied=None, matrices="linear")
_RULES = {"afmuon": ("lmo", "rms"), "sign": ("lmo", "rms"), "hybrid": ("adamw", "adamw"),
          **{f"factorial_{t}_{v}": (t, v) for t in ("lmo", "adamw") for v in ("rms", "adamw")}}


def build_optimizer(model: nn.Module, preset: str = "afmuon", **overrides: Any) -> torch.optim.Optimizer:
    """An optimizer for `model` (seed 004 §3.1, Apps. J–K). Overrides: keys of _BUILD (lr = Muon/tied base LR,
    vector_lr, weight_decay = matrix decay, cap, scale, rho, aux_* = the AdamW groups, tied, matrices);
    for "adamw": lr, weight_decay, eps, aux_betas. The optimizer gets `.roles` (role -> names)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; presets: {', '.join(PRESETS)}")
    unknown = set(overrides) - set(_BUILD)
    if unknown:
        raise TypeError(f"unknown build_optimizer overrides {sorted(unknown)}; allowed: {sorted(_BUILD)}")
    if preset == "adamw":
        o = {**_BUILD, "lr": 6e-4, "weight_decay": 0.1, **overrides}
        params = [p for _, p in _unique(model)]
        opt: torch.optim.Optimizer = torch.optim.AdamW(params, lr=o["lr"], betas=o["aux_betas"], eps=o["eps"],
                                                       weight_decay=o["weight_decay"])
        opt.roles = {"adamw": [n for n, _ in _unique(model)]}  # type: ignore[attr-defined]
        return opt
    if preset == "hybrid_untied":
        return _untied_hybrid(model, {**_BUILD, "aux_weight_decay": 0.01, **overrides})
    if preset == "sign" and "cap" in overrides:
        raise ValueError("the sign preset fixes cap = 1")
    o = {**_BUILD, **({"cap": 1.0, "scale": 1.0} if preset == "sign" else {}),
         **({"aux_weight_decay": 0.01} if preset == "hybrid" else {}), **overrides}
    parts = partition_by_role(model, tied=o["tied"], matrices=o["matrices"])
    rule_t, rule_v = _RULES[preset]
    return _assemble(parts, {
        "matrix": _matrix_group(o),
        "tied": dict(role="tied", lr=o["lr"], cap=o["cap"], scale=o["scale"], rho=o["rho"],
                     chunk_rows=o["chunk_rows"]) if rule_t == "lmo" else _aux_group(o),
        "vector": dict(role="vector", lr=o["vector_lr"], eps=o["eps"]) if rule_v == "rms" else _aux_group(o)},
        o["momentum"])


def _matrix_group(o: dict) -> dict:
    return dict(role="matrix", lr=o["lr"], weight_decay=o["weight_decay"], ns_steps=o["ns_steps"])


def _aux_group(o: dict) -> dict:
    """Hybrid's AdamW group (released code; seed 004 §3.1 gives only wd 0.01): betas (0.9, 0.95), eps 1e-10, bias-corrected."""
    return dict(role="adamw", lr=o["aux_lr"], betas=o["aux_betas"], eps=o["aux_eps"], weight_decay=o["aux_weight_decay"])


def _assemble(parts: dict[str, Named], groups: dict[str, dict], momentum: float) -> "AFMuon":
    """One group per part (its `part` and `params`), the optimizer's `.roles` (part -> names)."""
    for part, group in groups.items():
        group.update(part=part, params=[p for _, p in parts[part]])
    opt = AFMuon(list(groups.values()), momentum=momentum)
    opt.roles = {k: [n for n, _ in v] for k, v in parts.items()}  # type: ignore[attr-defined]
    return opt


def is_tied(model: nn.Module) -> bool:
    try:
        find_tied(model)
    except ValueError:
        return False
    return True


def _untied_hybrid(model: nn.Module, o: dict) -> torch.optim.Optimizer:
    """Seed 004 Table 15's untied control: Muon on the hidden matrices; every vocabulary table
    (input embeddings and the output head) and every 1-D tensor on Hybrid's AdamW."""
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    tables = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    if out is not None:
        tables.add(id(out.weight))
    linear = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    linear |= {id(m.in_proj_weight) for m in model.modules()
               if isinstance(m, nn.MultiheadAttention) and m.in_proj_weight is not None}
    parts: dict[str, Named] = {"matrix": [], "tables": [], "vector": []}
    for name, p in _unique(model):
        if id(p) in tables:
            parts["tables"].append((name, p))
        elif p.ndim <= 1:
            parts["vector"].append((name, p))
        elif id(p) in linear:
            parts["matrix"].append((name, p))
        else:
            raise ValueError(f"{name}: unrecognised {p.ndim}-D tensor {tuple(p.shape)} has no Hybrid role")
    return _assemble(parts, {"matrix": _matrix_group(o), "tables": _aux_group(o), "vector": _aux_group(o)},
                     o["momentum"])


def _unique(model: nn.Module) -> Named:
    seen: set[int] = set()
    return [(n, p) for n, p in model.named_parameters()
            if p.requires_grad and not (id(p) in seen or seen.add(id(p)))]


def state_bytes(opt: torch.optim.Optimizer) -> int:
    """Bytes of every tensor in the optimizer state (works for meta tensors)."""
    return sum(t.numel() * t.element_size() for st in opt.state.values() for t in st.values()
               if isinstance(t, Tensor))


SOURCES = ("lookup", "softmax", "both")


class GradientSources:
    """Split the tied table's gradient into its lookup and softmax sources (seed 004 App. K.8).

    While the context is open, every `F.embedding` call that reads the tied table (what nn.Embedding
    modules run, so 3-way ties' encoder and decoder lookups too) registers a hook on its raw lookup
    output that index-adds dL/d(lookup) into an fp32 V x d buffer (the table's dtype where wider: G_in, across micro-batches;
    padding_idx rows skipped). Hooking the raw lookup, not a module's output, keeps a scale applied
    inside the module (Gemma's sqrt(d) embed_scale in T5Gemma2) in the gradient, as autograd has it.
    G_out = table.grad - G_in, so the capture must start with table.grad None/zero. Lookups by other
    ops (indexing the table) are attributed to softmax; scale_grad_by_freq / max_norm are rejected.
    """

    def __init__(self, model: nn.Module, tied: str | Tensor | None = None) -> None:
        self.table = find_tied(model, tied)[1]
        dtype = torch.promote_types(self.table.dtype, torch.float32)  # bf16 tables: fp32; a float64 table: float64
        self.lookup = torch.zeros(self.table.shape, dtype=dtype, device=self.table.device)
        self._mods = [m for m in model.modules() if isinstance(m, nn.Embedding) and m.weight is self.table]
        if not self._mods:
            raise ValueError("no nn.Embedding module uses the tied table")
        if any(m.scale_grad_by_freq or m.max_norm is not None for m in self._mods):
            raise ValueError("scale_grad_by_freq / max_norm embeddings are not supported")
        self._mode: _LookupCapture | None = None

    def __enter__(self) -> GradientSources:
        self._mode = _LookupCapture(self)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._mode is not None:
            self._mode.__exit__(*exc)
            self._mode = None

    def _on_lookup(self, ids: Tensor, pad: int | None, out: Tensor) -> None:
        if not out.requires_grad:
            return
        ids = ids.reshape(-1)
        keep = None if pad is None else ids != pad

        def add(grad: Tensor) -> None:
            g = grad.reshape(-1, grad.shape[-1]).to(self.lookup.dtype)
            self.lookup.index_add_(0, ids if keep is None else ids[keep], g if keep is None else g[keep])
        out.register_hook(add)

    def reset(self) -> None:  # between optimizer steps
        self.lookup.zero_()

    def sources(self) -> dict[str, Any]:
        """lookup / softmax / both gradients (in the buffer's dtype), row coverage of each source, their cosine."""
        if self.table.grad is None:
            raise RuntimeError("the tied table has no gradient: run backward inside the context first")
        both = self.table.grad.to(self.lookup.dtype)
        g_in, g_out = self.lookup.clone(), both - self.lookup
        cover = {f"{k}_rows": (v != 0).any(dim=1).float().mean().item()
                 for k, v in (("lookup", g_in), ("softmax", g_out))}
        den = (g_in.norm() * g_out.norm()).item()
        cos = (g_in * g_out).sum().item() / den if den > 0 else 0.0
        return {"lookup": g_in, "softmax": g_out, "both": both, **cover, "cosine": cos}

    def apply(self, source: str) -> None:
        """Replace table.grad by one source (the K.8 intervention; call before clipping)."""
        if source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
        if source != "both":
            self.table.grad = self.sources()[source].to(self.table.dtype)


class _LookupCapture(torch.overrides.TorchFunctionMode):
    """Sees every F.embedding call while open; hands those that read the tied table to their capture."""

    def __init__(self, capture: GradientSources) -> None:
        super().__init__()
        self.capture = capture

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is torch.nn.functional.embedding:
            bound = inspect.signature(func).bind(*args, **kwargs)
            if bound.arguments["weight"] is self.capture.table:
                if bound.arguments.get("scale_grad_by_freq") or bound.arguments.get("max_norm") is not None:
                    raise ValueError("scale_grad_by_freq / max_norm embeddings are not supported")
                self.capture._on_lookup(bound.arguments["input"], bound.arguments.get("padding_idx"), out)
        return out


def gradient_sources(model: nn.Module, batch_fn: Callable[[nn.Module], Tensor], *,
                     tied: str | Tensor | None = None) -> dict[str, Any]:
    """Zero the model's grads, run loss = batch_fn(model); loss.backward() under GradientSources, and
    return its `sources()` plus "loss". Gradients are left in .grad (the merged ones)."""
    model.zero_grad(set_to_none=True)
    with GradientSources(model, tied) as cap:
        loss = batch_fn(model)
        loss.backward()
    return {**cap.sources(), "loss": loss.item()}
