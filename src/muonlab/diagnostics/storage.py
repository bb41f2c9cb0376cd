"""Saved-tensor storage audit of the pre-sublayer gain implementations (seed 000 §3.1, §4.1 Table 1;
spec-000-003 §1.A "Memory claims" and §2 item 1).

Seed 000 deduplicates the tensors saved for backward by `untyped_storage().data_ptr()` and counts
unique storages of a full (B, T, d) activation (`nbytes = B*T*d*itemsize`) and of a compact (B, T, 32)
gate input. Its claim: with `ve_gate(x_hat[..., :32])` (unfused_slice) the saved slice view pins the
whole unscaled x_hat on every value-embedding layer, so Delta = n_ve * B*T*d*itemsize bytes
((L/2) B T d 2 in bf16: 256 MiB at depth 8, B=32, T=2048); `.contiguous()` (unfused_contig) keeps
only a (B, T, 32) copy per layer; weight fusion keeps neither. Counts in the paper are for PyTorch
2.9.1+cu126 / TorchInductor on GPU; this module reports what the installed torch gives.

Choices (unstated or CPU-specific):
- Capture: a `torch.autograd.graph.saved_tensors_hooks` pack hook around one forward (the loss is
  inside the forward); backward runs afterwards, outside the hooks. AOTAutograd's compiled function
  saves through `ctx.save_for_backward`, which the hooks see (plain-function hooks are not inlined
  into the graph: torch inlines only GraphModule hooks). Cross-check in compiled mode: the backward
  compiler is wrapped to record the storages its graph receives as saved inputs (all placeholders but
  `tangents_*`); `result["bw_storages"]` is that set's size and `result["bw_matches_hooks"]` whether it
  equals the hook set (the compiled model uses fullgraph=True, so no eager op saves outside the graph).
- Compiled mode: torch.compile(fullgraph=True) with the `aot_eager_decomp_partition` backend rebuilt
  from its torch source (Inductor decompositions, min-cut partitioner, nop forward compiler), only so
  the backward compiler can record; it runs on CPU without a C++ compiler. It is not Inductor, so the
  absolute counts differ from the paper's; the relations between implementations are what is tested.
- Eager mode saves the unscaled x_hat anyway (x_hat * gain saves it for the gain's gradient), so the
  slice pinning cannot show there. The min-cut partitioner leaves x_hat out of the saved set (it is
  recomputed from the block input) unless the gate needs x_hat[..., :32]: torch 2.13 then saves the
  view's base x_hat itself (the slice is regenerated in backward), the pinned full buffer.
- Counted: unique storages whose nbytes is the full (gate) size AND whose saved tensor has the
  activation dtype (the paper's "bf16 storages"; fp32 tensors of equal nbytes are reported apart).
- Activation dtype (`dtype`): float32 (default, CPU) runs `model.float()` without autocast (itemsize
  4); bfloat16 keeps init_weights' bf16 embeddings (so the residual stream is bf16, as upstream) and
  runs under `torch.autocast("cpu", bfloat16)` (itemsize 2). Under autocast the fp32 gains promote
  x_hat * gain to fp32, so gate_scaled's slice of it is cast to a compact bf16 copy (+1 gate storage
  per ve layer, the paper's 93/4); in fp32 that slice aliases the saved x_hat * gain (+0).
- Model: `gpt_config(presub_gains=impl, attn_backend="sdpa", sequence_len=seq_len)`, vocab 64, seeded
  init, then "trained-looking" values so nothing is neutral: gains 1 + 0.05 N(0,1) (raw 0.05 N for
  stopexp), c_proj weights N(0, 0.02), ve_gate weights N(0, 0.5). Tokens: seeded randint; loss = CE
  on the tokens rolled by one.
- Sizes: the defaults (d=128, 4 heads, B=2, T=48, vocab 64) are chosen so no other saved tensor has
  the full or the gate nbytes (q/k/v are (B,T,d) too and count as full, as in the paper; attention
  probabilities B*H*T*T, the (T,T) mask, 4d hidden, weights d*d, 4d*d, V*d and logits B*T*V all
  differ). T = 32 B would make the gate size equal T*T; B*T = d the full size equal d*d.
- Single block (seed 000's "single-block AOTAutograd"): the first has_ve and first plain block of the
  same model, compiled alone, fed x ~ N(0,1) (B,T,d) requiring grad, its value embedding, the model's
  rotary tables and window; the output's sum is backpropagated.
- MB in the paper's table is MiB (93 x 64 MiB = 5952.0 "MB"); `*_mb` here are MiB.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from importlib import import_module
from typing import Any, Callable

import torch

from muonlab.model import GPT, GPTConfig, find_variant, gpt_config
from muonlab.model.gpt import has_ve
from muonlab.model.scalings import PRESUB_GAINS

IMPLS = PRESUB_GAINS
MODES = ("eager", "compiled")
GATE_CHANNELS = 32
MIB = 2 ** 20
PAPER = {"depth8_B32": {"none": (93, 0), "weight_fused": (93, 0), "unfused_slice": (97, 0),
                        "unfused_contig": (93, 4), "gate_scaled": (93, 4)},
         "single_block": {"has_ve": (5, 4), "no_ve": (4, 4)}}  # (unfused, weight_fused); torch 2.9.1


def build_model(config: GPTConfig, dtype: torch.dtype = torch.float32, seed: int = 0) -> GPT:
    """The audited model: seeded init plus the non-neutral values listed in the module docstring."""
    torch.manual_seed(seed)
    model = GPT(config)
    model.init_weights()
    model = model.float() if dtype == torch.float32 else model
    with torch.no_grad():
        gains = find_variant(model, "presub_gains")
        if gains is not None:
            base = 1.0 if gains.cfg.param == "linear" else 0.0
            model.presub_gains.copy_(base + 0.05 * torch.randn_like(model.presub_gains))
        for block in model.transformer.h:
            block.attn.c_proj.weight.normal_(0, 0.02)
            block.mlp.c_proj.weight.normal_(0, 0.02)
            if block.attn.ve_gate is not None:
                block.attn.ve_gate.weight.normal_(0, 0.5)
    return model


def _backend(record: set[int]) -> Callable[..., Any]:
    """`aot_eager_decomp_partition` (torch._dynamo.backends.debugging) whose backward records its saved inputs."""
    from functorch.compile import min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import boxed_nop

    def bw_compiler(gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        saved = [not n.name.startswith("tangents") for n in gm.graph.nodes if n.op == "placeholder"]
        inner = boxed_nop(gm, example_inputs)

        def run(args: list) -> Any:
            record.update(a.untyped_storage().data_ptr() for a, s in zip(args, saved)
                          if s and isinstance(a, torch.Tensor))
            return inner(args)
        run._boxed_call = True  # type: ignore[attr-defined]
        return run

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        with torch._functorch.config.patch(unlift_effect_tokens=True):
            return aot_autograd(
                fw_compiler=boxed_nop, bw_compiler=bw_compiler,
                decompositions=lambda: import_module("torch._inductor.compile_fx").select_decomp_table(),
                partition_fn=functools.partial(min_cut_rematerialization_partition, compiler="inductor"),
            )(gm, example_inputs)
    return backend


def _capture(fn: Callable[[], torch.Tensor], mode: str, dtype: torch.dtype, device: str = "cpu"):
    """Run fn (a loss) under the pack hook, then backward; {data_ptr: (nbytes, dtype, shapes)}, bw-recorded ptrs."""
    storages: dict[int, tuple[int, torch.dtype, list]] = {}
    recorded: set[int] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        storages.setdefault(s.data_ptr(), (s.nbytes(), t.dtype, []))[2].append(tuple(t.shape))
        return t
    torch._dynamo.reset()
    run = torch.compile(fn, backend=_backend(recorded), fullgraph=True) if mode == "compiled" else fn
    amp = (torch.autocast(device, dtype=dtype) if dtype != torch.float32 else contextlib.nullcontext())
    with amp, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), warnings.catch_warnings():
        # dynamo traces through the cached window mask (a pure function of T and the window): harmless here
        warnings.filterwarnings("ignore", message="Dynamo detected a call to a `functools.lru_cache`")
        loss = run()
    loss.backward()
    torch._dynamo.reset()
    return storages, recorded


def _summarise(storages: dict, recorded: set, mode: str, B: int, T: int, d: int, dtype: torch.dtype) -> dict:
    full_bytes, gate_bytes = B * T * d * dtype.itemsize, B * T * GATE_CHANNELS * dtype.itemsize
    full = [v for v in storages.values() if v[0] == full_bytes and v[1] == dtype]
    gate = [v for v in storages.values() if v[0] == gate_bytes and v[1] == dtype]
    out = {"full": len(full), "gate": len(gate), "full_mb": len(full) * full_bytes / MIB,
           "gate_mb": len(gate) * gate_bytes / MIB, "storages": len(storages),
           "bytes_full": full_bytes, "bytes_gate": gate_bytes,
           "saved_mb": sum(v[0] for v in storages.values()) / MIB,
           "full_shapes": sorted({s for v in full for s in v[2]}),
           "gate_shapes": sorted({s for v in gate for s in v[2]}),
           "same_bytes_other_dtype": sum(v[0] in (full_bytes, gate_bytes) and v[1] != dtype
                                         for v in storages.values())}
    if mode == "compiled":
        out["bw_storages"] = len(recorded)
        out["bw_matches_hooks"] = recorded == set(storages)
    return out


def _check(mode: str, dtype: torch.dtype) -> None:
    if mode not in MODES or dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"mode must be one of {MODES} and dtype float32 or bfloat16, got {mode!r}, {dtype}")


def audit_storage(config: GPTConfig, batch: int, seq_len: int, mode: str = "compiled",
                  dtype: torch.dtype = torch.float32, seed: int = 0) -> dict:
    """Counts of unique saved storages of full (B,T,d) and gate (B,T,32) size over one forward."""
    _check(mode, dtype)
    model = build_model(config, dtype, seed)
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, config.vocab_size, (batch, seq_len), generator=gen)
    storages, recorded = _capture(lambda: model(idx, idx.roll(-1, 1)), mode, dtype)
    return _summarise(storages, recorded, mode, batch, seq_len, config.n_embd, dtype)


def audit_block(config: GPTConfig, layer: int, batch: int, seq_len: int, mode: str = "compiled",
                dtype: torch.dtype = torch.float32, seed: int = 0) -> dict:
    """The same counts for block `layer` alone (seed 000's single-block AOTAutograd audit)."""
    _check(mode, dtype)
    model = build_model(config, dtype, seed)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, seq_len, config.n_embd, generator=gen).to(dtype).requires_grad_(True)
    idx = torch.randint(0, config.vocab_size, (batch, seq_len), generator=gen)
    ve = model.value_embeds[str(layer)](idx) if str(layer) in model.value_embeds else None
    cos_sin = model.cos[:, :seq_len], model.sin[:, :seq_len]
    block, window = model.transformer.h[layer], model.window_sizes[layer]
    storages, recorded = _capture(lambda: block(x, ve, cos_sin, window).float().sum(), mode, dtype)
    return _summarise(storages, recorded, mode, batch, seq_len, config.n_embd, dtype)


def n_ve_layers(config: GPTConfig) -> int:
    return sum(has_ve(i, config.n_layer) for i in range(config.n_layer))


def predicted_slice_delta(config: GPTConfig, batch: int, seq_len: int, itemsize: int = 2) -> float:
    """Seed 000's Delta VRAM of the slice view in MiB: n_ve * B*T*d*itemsize ((L/2) B T d 2 in bf16)."""
    return n_ve_layers(config) * batch * seq_len * config.n_embd * itemsize / MIB


def audit_config(n_layer: int = 4, n_embd: int = 128, n_head: int = 4, seq_len: int = 48,
                 vocab_size: int = 64, impl: str = "none") -> GPTConfig:
    return gpt_config(sequence_len=seq_len, vocab_size=vocab_size, n_layer=n_layer, n_head=n_head,
                      n_kv_head=n_head, n_embd=n_embd, attn_backend="sdpa", presub_gains=impl)


def run_storage_audit(n_layer: int = 4, n_embd: int = 128, n_head: int = 4, batch: int = 2,
                      seq_len: int = 48, modes: tuple[str, ...] = MODES, impls: tuple[str, ...] = IMPLS,
                      dtype: torch.dtype = torch.float32, seed: int = 0, single_block: bool = True,
                      predict_for: tuple[int, int, int, int] = (8, 512, 32, 2048)) -> dict:
    """Whole-model audit per impl x mode, the compiled single-block audit (unfused_slice vs
    weight_fused on a has_ve and a plain block), and the predicted slice-view Delta at
    `predict_for` = (depth, d, B, T) in bf16 (depth 8, d 512, B 32, T 2048: 256 MiB)."""
    models = {impl: {mode: audit_storage(audit_config(n_layer, n_embd, n_head, seq_len, impl=impl),
                                         batch, seq_len, mode, dtype, seed) for mode in modes}
              for impl in impls}
    blocks: dict[str, dict[str, dict]] = {}
    if single_block:
        ve_layer = next(i for i in range(n_layer) if has_ve(i, n_layer))
        plain = next((i for i in range(n_layer) if not has_ve(i, n_layer)), None)
        for name, layer in (("has_ve", ve_layer), ("no_ve", plain)):
            if layer is not None:
                blocks[name] = {impl: audit_block(audit_config(n_layer, n_embd, n_head, seq_len, impl=impl),
                                                  layer, batch, seq_len, "compiled", dtype, seed)
                                for impl in ("unfused_slice", "weight_fused")}
    depth, d, B, T = predict_for
    pred_cfg = audit_config(depth, d, 1, T)
    return {"setup": dict(n_layer=n_layer, n_embd=n_embd, n_head=n_head, batch=batch, seq_len=seq_len,
                          dtype=str(dtype), torch=torch.__version__, n_ve=n_ve_layers(audit_config(n_layer))),
            "models": models, "blocks": blocks,
            "predicted": dict(depth=depth, n_embd=d, batch=B, seq_len=T, n_ve=n_ve_layers(pred_cfg),
                              delta_mib=predicted_slice_delta(pred_cfg, B, T, 2),
                              audit_delta_mib=predicted_slice_delta(audit_config(n_layer, n_embd), batch,
                                                                    seq_len, dtype.itemsize))}


def format_storage_table(result: dict) -> str:
    s = result["setup"]
    lines = [f"saved-storage audit (seed 000 Table 1): L={s['n_layer']} d={s['n_embd']} B={s['batch']} "
             f"T={s['seq_len']} {s['dtype']} torch {s['torch']}, {s['n_ve']} value-embedding layers",
             f"{'impl':<16}{'mode':<10}{'BTD / gate (MiB)':>26}{'storages':>10}"]
    for impl, per_mode in result["models"].items():
        for mode, r in per_mode.items():
            cell = f"{r['full']} / {r['gate']} ({r['full_mb'] + r['gate_mb']:.3f})"
            lines.append(f"{impl:<16}{mode:<10}{cell:>26}{r['storages']:>10}")
    for name, per_impl in result["blocks"].items():
        cells = ", ".join(f"{impl} {r['full']} BTD / {r['gate']} gate" for impl, r in per_impl.items())
        lines.append(f"single block ({name}, compiled): {cells}  [paper, torch 2.9.1: "
                     f"{PAPER['single_block'][name][0]} vs {PAPER['single_block'][name][1]}]")
    p = result["predicted"]
    lines.append(f"predicted slice-view Delta = n_ve x B x T x d x 2 B: depth {p['depth']} ({p['n_ve']} ve layers), "
                 f"B={p['batch']}, T={p['seq_len']}, d={p['n_embd']}: {p['delta_mib']:.3f} MiB; "
                 f"at the audited shape {p['audit_delta_mib']:.6f} MiB")
    return "\n".join(lines)
