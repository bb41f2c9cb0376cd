"""Saved-tensor storage audit of the pre-sublayer gain implementations (seed 000 §3.1, §4.1 Table 1;
§1 item 1, §6 step 2), with the peak-memory profile on CUDA.

Seed 000 deduplicates the tensors saved for backward by `untyped_storage().data_ptr()` and counts
unique storages of a full (B, T, d) activation (`nbytes = B*T*d*itemsize`) and of a compact (B, T, 32)
gate input, on its compiled depth-8 TorchInductor GPU model (B=32 and 64, T=2048, bf16 autocast,
seed 47), beside the peak allocated memory of one forward+backward. Its claim: with
`ve_gate(x_hat[..., :32])` (unfused_slice) the saved slice view pins the whole unscaled x_hat on
every value-embedding layer, so Delta = n_ve * B*T*d*itemsize bytes ((L/2) B T d 2 in bf16: 256 MiB
at depth 8, B=32, T=2048); `.contiguous()` (unfused_contig) keeps only a (B, T, 32) copy per layer;
weight fusion keeps neither. Its counts are for PyTorch 2.9.1+cu126; this module reports what the
installed torch gives, beside the printed figures (PAPER).

What is audited (`resolve_setup`): the GPT of `--preset`/`--arm` (its depth, width, heads, windows,
attention backend, head loss and vocabulary; --depth/--seq-len override the preset's, --batch its
device batch), or without a preset a small CPU shape (the defaults below). `presub_gains` is set to
each implementation in turn. Precision: fp32 or bf16 (default the preset's runtime.precision
resolved on the device, i.e. bf16 on CUDA; without a preset bf16 on CUDA and fp32 elsewhere).
Seed: --seed, else the arm's seed, else 0.

Backends (`--backend`): "inductor" (the paper's) is `torch._inductor.compile_fx.compile_fx` (what
`torch.compile(backend="inductor")` calls) with its `inner_compile` argument wrapped: the wrapper
counts the backward graph's saved inputs (placeholders but `tangents_*`) when compile_fx_backward
calls it with is_backward=True, then delegates to Inductor's own `compile_fx_inner` unchanged. That
keyword argument and compile_fx's `inner_compile` parameter are the only torch internals relied on
(the compiled function itself is not wrapped: its OutputCode protocol is private). The default is
inductor on CUDA, and on CPU where the C++ compiler Inductor calls ($CXX, else g++; clang++ on macOS)
exists, else "aot_eager": `aot_eager_decomp_partition` (torch._dynamo.backends.debugging) rebuilt
from its source (Inductor decompositions, the min-cut partitioner, no code generation) so its
backward compiler can count the same way. The AOTAutograd cache is off during the compile (a hit
would skip the backward compiler); Inductor's own kernel cache stays on.

Capture (both backends, and eager): a `torch.autograd.graph.saved_tensors_hooks` pair around one
forward (the loss is inside the forward); backward runs afterwards. The pack hook sees every
tensor AOTAutograd's compiled function saves through `ctx.save_for_backward` (plain-function hooks
are not inlined into the graph: torch inlines only GraphModule hooks) and records its storage; the
unpack hook records the storages the backward graph receives at run time. `bw_matches_hooks`: the
two storage sets are equal AND the backward graph has exactly one saved input per packed tensor
(so nothing is saved outside the hooks; the model is compiled with fullgraph=True).

Peak memory (CUDA only): one warm-up forward+backward (compilation, autotuning and lazy
initialisation), gradients set to None, `torch.cuda.reset_peak_memory_stats`, then the captured
forward+backward; `peak_mib` = `torch.cuda.max_memory_allocated` / 2^20 (model weights included, no
optimizer), `delta_mib` = peak minus the "none" implementation's in the same mode (the paper's
"Delta VRAM vs Base"). On other devices the column says "n/a (CUDA only)". The absolute peak
depends on the head loss (the preset's "fused" never holds the [B*T, V] fp32 logits upstream's
model, the paper's, does); the deltas do not.

Choices (unstated or CPU-specific):
- Eager mode saves the unscaled x_hat anyway (x_hat * gain saves it for the gain's gradient), so the
  slice pinning cannot show there. The min-cut partitioner leaves x_hat out of the saved set (it is
  recomputed from the block input) unless the gate needs x_hat[..., :32]: torch 2.13 then saves the
  view's base x_hat itself (the slice is regenerated in backward), the pinned full buffer.
- Counted: unique storages whose nbytes is the full (gate) size AND whose saved tensor has the
  activation dtype (the paper's "bf16 storages"; fp32 tensors of equal nbytes are reported apart).
  At shapes where another saved tensor has the same nbytes it counts too (the paper's unexplained
  baseline "1 gate" at B=64); `full_shapes`/`gate_shapes` list the shapes seen.
- Activation dtype: fp32 runs `model.float()` without autocast (itemsize 4); bf16 keeps
  init_weights' bf16 embeddings (so the residual stream is bf16, as upstream) and runs under
  `torch.autocast(device type, bfloat16)` (itemsize 2). Under autocast the fp32 gains promote
  x_hat * gain to fp32, so gate_scaled's slice of it is cast to a compact bf16 copy (+1 gate storage
  per ve layer, the paper's 93/4); in fp32 that slice aliases the saved x_hat * gain (+0).
- Model: built and initialised on the CPU (so its values do not depend on the device), then moved
  to the device, the attention backend resolved there; then "trained-looking" values so nothing is
  neutral: gains 1 + 0.05 N(0,1) (raw 0.05 N for stopexp), c_proj weights N(0, 0.02), ve_gate
  weights N(0, 0.5). Tokens: seeded randint; loss = the model's loss on the tokens rolled by one.
- Default shape without a preset (d=128, 4 heads, L=4, B=2, T=48, vocab 64): no other saved tensor
  has the full or the gate nbytes (q/k/v are (B,T,d) too and count as full, as in the paper;
  attention probabilities B*H*T*T, the (T,T) mask, 4d hidden, weights d*d, 4d*d, V*d and logits
  B*T*V all differ). T = 32 B would make the gate size equal T*T; B*T = d the full size equal d*d.
- Single block (seed 000's "single-block AOTAutograd", which the paper ran with
  aot_eager_decomp_partition): always that backend, whatever --backend says; the first has_ve and
  first plain block of the same model, fed x ~ N(0,1) (B,T,d) requiring grad, its value embedding,
  the model's rotary tables and window; the output's sum is backpropagated.
- MB in the paper's table is MiB (93 x 64 MiB = 5952.0 "MB"); `*_mb` and `*_mib` here are MiB.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import shutil
import sys
import warnings
from dataclasses import dataclass
from importlib import import_module
from typing import Any, Callable

import torch

from muonlab.device import detect_device, resolve_precision
from muonlab.settings import integer_at_least, seed_value
from muonlab.errors import UsageError
from muonlab.model import GPT, GPTConfig, find_variant
from muonlab.train.build import gpt_config_with
from muonlab.model.gpt import has_ve
from muonlab.model.variants.presub_gains import PRESUB_GAINS
from muonlab.diagnostics import Command

IMPLS = PRESUB_GAINS
MODES = ("eager", "compiled")
BACKENDS = ("inductor", "aot_eager")
GATE_CHANNELS = 32
MIB = 2 ** 20
NO_PEAK = "n/a (CUDA only)"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _row(full: int, gate: int, mb: float, peak: float, delta: float | None) -> dict:
    return dict(full=full, gate=gate, mb=mb, peak_mib=peak, delta_mib=delta)


# seed 000 Table 1 (depth 8, d 512, T 2048, bf16, seed 47, torch 2.9.1+cu126): BTD / gate storages,
# their MiB, peak VRAM and its delta vs the baseline ("MB" = MiB)
PAPER = {
    "depth8": {
        "32": {"none": _row(93, 0, 5952.0, 11492.76, None), "weight_fused": _row(93, 0, 5952.0, 11492.84, 0.08),
             "unfused_slice": _row(97, 0, 6208.0, 11748.84, 256.08),
             "unfused_contig": _row(93, 4, 5968.0, 11508.84, 16.08),
             "gate_scaled": _row(93, 4, 5968.0, 11508.84, 16.08)},
        "64": {"none": _row(93, 1, 11912.0, 22596.26, None), "weight_fused": _row(93, 1, 11912.0, 22596.34, 0.08),
             "unfused_slice": _row(97, 1, 12424.0, 23108.34, 512.08),
             "unfused_contig": _row(93, 5, 11944.0, 22628.34, 32.08),
             "gate_scaled": _row(93, 5, 11944.0, 22628.34, 32.08)}},
    "single_block": {"has_ve": (5, 4), "no_ve": (4, 4)}}  # (unfused, weight_fused), aot_eager_decomp_partition
PAPER_SHAPE = dict(n_layer=8, n_embd=512, seq_len=2048, dtype="torch.bfloat16")


def build_model(config: GPTConfig, dtype: torch.dtype = torch.float32, seed: int = 0,
                device: torch.device | str = "cpu") -> GPT:
    """The audited model: seeded init on the CPU, the non-neutral values of the module docstring,
    then moved to `device` with its attention backend resolved there."""
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
    model = model.to(device)
    model.resolve_attention_backend()
    return model


def _saved_inputs(gm: torch.fx.GraphModule) -> int:
    """A backward graph's saved inputs: its placeholders but the incoming gradients."""
    return sum(n.op == "placeholder" and not n.name.startswith("tangents") for n in gm.graph.nodes)


def _inductor_backend(record: list[int]) -> Callable[..., Any]:
    """Inductor (compile_fx) whose backward compile appends its saved-input count to `record`."""
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    def inner_compile(gm: torch.fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
        if kwargs.get("is_backward"):
            record.append(_saved_inputs(gm))
        return compile_fx_inner(gm, example_inputs, **kwargs)
    return functools.partial(compile_fx, inner_compile=inner_compile)


def _aot_eager_backend(record: list[int]) -> Callable[..., Any]:
    """`aot_eager_decomp_partition` (torch._dynamo.backends.debugging), counting like _inductor_backend."""
    from functorch.compile import min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import boxed_nop

    def bw_compiler(gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        record.append(_saved_inputs(gm))
        return boxed_nop(gm, example_inputs)

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        with torch._functorch.config.patch(unlift_effect_tokens=True):
            return aot_autograd(
                fw_compiler=boxed_nop, bw_compiler=bw_compiler,
                decompositions=lambda: import_module("torch._inductor.compile_fx").select_decomp_table(),
                partition_fn=functools.partial(min_cut_rematerialization_partition, compiler="inductor"),
            )(gm, example_inputs)
    return backend


def cxx_compiler() -> str | None:
    """The C++ compiler Inductor's CPU backend would call ($CXX, else g++; clang++ on macOS), if present."""
    return shutil.which(os.environ.get("CXX") or ("clang++" if sys.platform == "darwin" else "g++"))


def default_backend(device: torch.device) -> str:
    return "inductor" if device.type == "cuda" or (device.type == "cpu" and cxx_compiler()) else "aot_eager"


def free_unreachable(device: torch.device) -> None:
    """Collect what nothing references any more (a GPT holds reference cycles through its variants,
    so an audited model outlives its audit until the collector runs) and, on CUDA, hand its cached
    blocks back, so a peak measured next holds only the model being measured."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _capture(fn: Callable[[], torch.Tensor], leaves: list[torch.Tensor], mode: str, dtype: torch.dtype,
             device: torch.device, backend: str) -> dict:
    """Run fn (a loss) under the hooks, then backward; on CUDA after a warm-up, measuring the peak."""
    storages: dict[int, tuple[int, torch.dtype, list]] = {}
    unpacked: set[int] = set()
    bw_inputs: list[int] = []
    state = {"on": False, "tensors": 0}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if state["on"]:
            s = t.untyped_storage()
            storages.setdefault(s.data_ptr(), (s.nbytes(), t.dtype, []))[2].append(tuple(t.shape))
            state["tensors"] += 1
        return t

    def unpack(t: torch.Tensor) -> torch.Tensor:
        if state["on"]:
            unpacked.add(t.untyped_storage().data_ptr())
        return t

    torch._dynamo.reset()
    make = {"inductor": _inductor_backend, "aot_eager": _aot_eager_backend}[backend]
    run = torch.compile(fn, backend=make(bw_inputs), fullgraph=True) if mode == "compiled" else fn
    amp = torch.autocast(device.type, dtype=dtype) if dtype != torch.float32 else contextlib.nullcontext()

    def once() -> None:
        with (amp, torch.autograd.graph.saved_tensors_hooks(pack, unpack), warnings.catch_warnings(),
              torch._functorch.config.patch(enable_autograd_cache=False)):
            # dynamo traces through the cached window mask (a pure function of T and the window): harmless
            warnings.filterwarnings("ignore", message="Dynamo detected a call to a `functools.lru_cache`")
            loss = run()
        loss.backward()

    cuda = device.type == "cuda"
    if cuda:  # warm-up: compile, autotune, lazy init; then a clean forward+backward is measured
        once()
        for t in leaves:
            t.grad = None
    free_unreachable(device)  # the earlier implementations' models must not count in this one's peak
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    state["on"] = True
    once()
    peak = None
    if cuda:
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) / MIB
    for t in leaves:
        t.grad = None
    torch._dynamo.reset()
    return dict(storages=storages, unpacked=unpacked, bw_inputs=bw_inputs, tensors=state["tensors"], peak=peak)


def _summarise(cap: dict, mode: str, backend: str, B: int, T: int, d: int, dtype: torch.dtype) -> dict:
    storages = cap["storages"]
    full_bytes, gate_bytes = B * T * d * dtype.itemsize, B * T * GATE_CHANNELS * dtype.itemsize
    full = [v for v in storages.values() if v[0] == full_bytes and v[1] == dtype]
    gate = [v for v in storages.values() if v[0] == gate_bytes and v[1] == dtype]
    out = {"full": len(full), "gate": len(gate), "full_mb": len(full) * full_bytes / MIB,
           "gate_mb": len(gate) * gate_bytes / MIB, "storages": len(storages), "saved_tensors": cap["tensors"],
           "bytes_full": full_bytes, "bytes_gate": gate_bytes,
           "saved_mb": sum(v[0] for v in storages.values()) / MIB,
           "full_shapes": sorted({s for v in full for s in v[2]}),
           "gate_shapes": sorted({s for v in gate for s in v[2]}),
           "same_bytes_other_dtype": sum(v[0] in (full_bytes, gate_bytes) and v[1] != dtype
                                         for v in storages.values()),
           "peak_mib": cap["peak"]}
    if mode == "compiled":
        out.update(backend=backend, bw_storages=len(cap["unpacked"]),
                   bw_graph_saved_inputs=cap["bw_inputs"],
                   bw_matches_hooks=cap["unpacked"] == set(storages) and cap["bw_inputs"] == [cap["tensors"]])
    return out


def _check(mode: str, dtype: torch.dtype, backend: str) -> None:
    if mode not in MODES or dtype not in (torch.float32, torch.bfloat16) or backend not in BACKENDS:
        raise ValueError(f"mode must be one of {MODES}, dtype float32 or bfloat16 and backend one of {BACKENDS}, "
                         f"got {mode!r}, {dtype}, {backend!r}")


def audit_storage(config: GPTConfig, batch: int, seq_len: int, mode: str = "compiled",
                  dtype: torch.dtype = torch.float32, seed: int = 0, backend: str = "aot_eager",
                  device: torch.device | str = "cpu") -> dict:
    """Counts of unique saved storages of full (B,T,d) and gate (B,T,32) size over one forward."""
    _check(mode, dtype, backend)
    device = torch.device(device)
    model = build_model(config, dtype, seed, device)
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, config.vocab_size, (batch, seq_len), generator=gen).to(device)
    cap = _capture(lambda: model(idx, idx.roll(-1, 1)), list(model.parameters()), mode, dtype, device, backend)
    return _summarise(cap, mode, backend, batch, seq_len, config.n_embd, dtype)


def audit_block(config: GPTConfig, layer: int, batch: int, seq_len: int, mode: str = "compiled",
                dtype: torch.dtype = torch.float32, seed: int = 0, backend: str = "aot_eager",
                device: torch.device | str = "cpu") -> dict:
    """The same counts for block `layer` alone (seed 000's single-block AOTAutograd audit)."""
    _check(mode, dtype, backend)
    device = torch.device(device)
    model = build_model(config, dtype, seed, device)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, seq_len, config.n_embd, generator=gen).to(device, dtype).requires_grad_(True)
    idx = torch.randint(0, config.vocab_size, (batch, seq_len), generator=gen).to(device)
    ve = model.value_embeds[str(layer)](idx) if str(layer) in model.value_embeds else None
    cos_sin = model.cos[:, :seq_len], model.sin[:, :seq_len]
    block, window = model.transformer.h[layer], model.window_sizes[layer]
    cap = _capture(lambda: block(x, ve, cos_sin, window).float().sum(), [x, *model.parameters()], mode, dtype,
                   device, backend)
    return _summarise(cap, mode, backend, batch, seq_len, config.n_embd, dtype)


def n_ve_layers(config: GPTConfig) -> int:
    return sum(has_ve(i, config.n_layer) for i in range(config.n_layer))


def predicted_slice_delta(config: GPTConfig, batch: int, seq_len: int, itemsize: int = 2) -> float:
    """Seed 000's Delta VRAM of the slice view in MiB: n_ve * B*T*d*itemsize ((L/2) B T d 2 in bf16)."""
    return n_ve_layers(config) * batch * seq_len * config.n_embd * itemsize / MIB


def audit_config(n_layer: int = 4, n_embd: int = 128, n_head: int = 4, seq_len: int = 48,
                 vocab_size: int = 64, impl: str = "none") -> GPTConfig:
    return gpt_config_with(dict(presub_gains=impl), sequence_len=seq_len, vocab_size=vocab_size, n_layer=n_layer,
                           n_head=n_head, n_kv_head=n_head, n_embd=n_embd, attn_backend="sdpa")


@dataclass(frozen=True)
class StorageSetup:
    """What the audit builds and runs (module docstring); `config(impl)` is the model's GPTConfig."""

    config: Callable[[str], GPTConfig]
    batch: int
    seq_len: int
    dtype: torch.dtype
    device: torch.device
    backend: str
    seed: int
    source: str


def _preset_config(preset: str, arm: str, depth: int | None, batch: int | None, seq_len: int | None,
                   device: torch.device):
    """The run config of preset + arm at the audited depth and micro-batch (B, T) (a changed B or T
    makes one micro-step the whole batch, so the training settings stay valid), and its GPTConfig
    per impl."""
    from muonlab.arms import resolve_config
    from muonlab.config import apply_overrides
    from muonlab.families.autoresearch import gpt_config as run_gpt_config

    extra = {} if depth is None else {"model.depth": depth}
    cfg = resolve_config(arm, preset, extra)
    B, T = batch or cfg.train.device_batch_size, seq_len or cfg.train.sequence_len
    if (B, T) != (cfg.train.device_batch_size, cfg.train.sequence_len):
        cfg = resolve_config(arm, preset, {**extra, "train.sequence_len": T, "train.device_batch_size": B,
                                           "train.total_batch_size": B * T,
                                           "train.eval_tokens": max(cfg.train.eval_tokens, T)})
    if cfg.family != "autoresearch":
        raise UsageError(f"the storage audit is of the autoresearch GPT's gains; arm {arm!r} under preset "
                         f"{preset!r} is of family {cfg.family!r}")
    off_cuda = {"model.attn_backend": "sdpa"} if device.type != "cuda" else {}  # FA3 exists only on CUDA

    def config(impl: str) -> GPTConfig:
        run = apply_overrides(cfg, {"model.gains.impl": impl, **off_cuda}, origin="storage audit")
        return run_gpt_config(run, run.data.vocab_size)
    return cfg, config


def _explicit_config(n_layer: int, n_embd: int, n_head: int, seq_len: int, impl: str) -> GPTConfig:
    return audit_config(n_layer, n_embd, n_head, seq_len, impl=impl)


def resolve_setup(preset: str | None = None, arm: str | None = None, seed: int | None = None,
                  depth: int | None = None, batch: int | None = None, seq_len: int | None = None,
                  device: str | None = None, precision: str | None = None, backend: str | None = None,
                  n_embd: int = 128, n_head: int = 4) -> StorageSetup:
    """The audited model, shape, precision, device and backend (see the module docstring). Device:
    the preset's (a GPU preset's "auto" must find CUDA: on the CPU it is refused unless --device cpu
    asks for it), else cpu."""
    if device is None and preset is not None:
        from muonlab.arms import resolve_config

        device = resolve_config(arm or "baseline", preset, {}).runtime.device
        if device == "auto" and detect_device("auto").type != "cuda":
            raise UsageError(f"preset {preset!r} is run on a GPU (the paper's compiled CUDA model) and no CUDA "
                             "device is here; --device cpu audits it on the CPU anyway (slow at its shape; "
                             "--batch and --seq-len shrink it)")
    dev = detect_device(device or "cpu")
    if backend is not None and backend not in BACKENDS:
        raise UsageError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "inductor" and dev.type == "cpu" and cxx_compiler() is None:
        raise UsageError("--backend inductor on CPU needs a C++ compiler ($CXX or g++); none was found")
    if precision is not None and precision not in DTYPES:
        raise UsageError(f"precision must be one of {', '.join(DTYPES)}, got {precision!r}")
    for name, value in (("depth", depth), ("batch", batch), ("seq-len", seq_len)):
        if value is not None and value < 1:
            raise UsageError(f"--{name} must be at least 1, got {value}")
    if preset is None:
        if arm is not None:
            raise UsageError("--arm needs --preset (the protocol the arm's model is built under)")
        n_layer, seq_len = depth or 4, seq_len or 48
        config = functools.partial(_explicit_config, n_layer, n_embd, n_head, seq_len)
        batch, run_seed = batch or 2, 0
        precision = precision or resolve_precision("auto", dev)
        source = f"explicit shape (L={n_layer}, d={n_embd}, vocab 64)"
    else:
        cfg, config = _preset_config(preset, arm or "baseline", depth, batch, seq_len, dev)
        seq_len, batch, run_seed = cfg.train.sequence_len, cfg.train.device_batch_size, cfg.seed
        precision = precision or resolve_precision(cfg.runtime.precision, dev)
        source = f"preset {preset}, arm {cfg.arm}"
    return StorageSetup(config, batch, seq_len, DTYPES[precision], dev, backend or default_backend(dev),
                        run_seed if seed is None else seed, source)


def run_storage_audit(setup: StorageSetup | None = None, modes: tuple[str, ...] = MODES,
                      impls: tuple[str, ...] = IMPLS, single_block: bool = True,
                      predict_for: tuple[int, int, int, int] = (8, 512, 32, 2048), **options: Any) -> dict:
    """Whole-model audit per impl x mode (compiled: `setup.backend`), the single-block audit
    (unfused_slice vs weight_fused on a has_ve and a plain block, aot_eager_decomp_partition), the
    CUDA peak memory and its delta vs "none" per mode, and the predicted slice-view Delta at
    `predict_for` = (depth, d, B, T) in bf16 (depth 8, d 512, B 32, T 2048: 256 MiB). `options`
    go to resolve_setup when no setup is given (preset, arm, seed, depth, batch, seq_len, device,
    precision, backend)."""
    s = setup or resolve_setup(**options)
    B, T, dtype, dev = s.batch, s.seq_len, s.dtype, s.device
    models = {impl: {mode: audit_storage(s.config(impl), B, T, mode, dtype, s.seed, s.backend, dev) for mode in modes}
              for impl in impls}
    for mode in modes:  # the paper's "Delta VRAM vs Base": against the "none" implementation
        base = models.get("none", {}).get(mode, {}).get("peak_mib")
        for impl in impls:
            r = models[impl][mode]
            r["delta_mib"] = None if base is None or r["peak_mib"] is None else r["peak_mib"] - base
    base_cfg = s.config("none")
    n_layer = base_cfg.n_layer
    blocks: dict[str, dict[str, dict]] = {}
    if single_block:
        ve_layer = next(i for i in range(n_layer) if has_ve(i, n_layer))
        plain = next((i for i in range(n_layer) if not has_ve(i, n_layer)), None)
        for name, layer in (("has_ve", ve_layer), ("no_ve", plain)):
            if layer is not None:
                blocks[name] = {impl: audit_block(s.config(impl), layer, B, T, "compiled", dtype, s.seed,
                                                  "aot_eager", dev)
                                for impl in ("unfused_slice", "weight_fused")}
    depth, d, pB, pT = predict_for
    pred_cfg = audit_config(depth, d, 1, pT)
    audit_delta = predicted_slice_delta(base_cfg, B, T, dtype.itemsize)
    slice_peak = models.get("unfused_slice", {}).get("compiled", {}).get("peak_mib")
    fused_peak = models.get("weight_fused", {}).get("compiled", {}).get("peak_mib")
    return {"setup": dict(source=s.source, n_layer=n_layer, n_embd=base_cfg.n_embd, n_head=base_cfg.n_head,
                          vocab_size=base_cfg.vocab_size, batch=B, seq_len=T, dtype=str(dtype), device=str(dev),
                          backend=s.backend, seed=s.seed, torch=torch.__version__, n_ve=n_ve_layers(base_cfg),
                          cxx=cxx_compiler()),
            "models": models, "blocks": blocks,
            "predicted": dict(depth=depth, n_embd=d, batch=pB, seq_len=pT, n_ve=n_ve_layers(pred_cfg),
                              delta_mib=predicted_slice_delta(pred_cfg, pB, pT, 2), audit_delta_mib=audit_delta,
                              measured_slice_minus_fused_mib=(None if slice_peak is None or fused_peak is None
                                                              else slice_peak - fused_peak)),
            "paper": PAPER, "paper_batch": 64 if B == 64 else 32,
            "verdict": verdict(models, n_ve_layers(base_cfg), B == 64 if B in (32, 64) else None,
                               _paper_shape({"n_layer": n_layer, "n_embd": base_cfg.n_embd, "seq_len": T,
                                             "dtype": str(dtype), "batch": B}))}


def verdict(models: dict, n_ve: int, batch64: bool | None, paper_shape: bool) -> dict:
    """The paper's claim checked on the compiled counts: against the "none" implementation, unfused_slice keeps
    one more full (B, T, d) storage per value-embedding layer, unfused_contig one more (B, T, 32) gate storage
    per layer and no full one, weight_fused neither; at the paper's shape, the counts are the paper's too."""
    compiled = {impl: per_mode.get("compiled") for impl, per_mode in models.items()}
    base = compiled.get("none")
    if base is None:
        return {"holds": None, "checks": [], "text": "no compiled 'none' implementation to compare with"}
    want = {"unfused_slice": (n_ve, 0), "unfused_contig": (0, n_ve), "weight_fused": (0, 0), "gate_scaled": (0, n_ve)}
    checks = []
    for impl, (full, gate) in want.items():
        r = compiled.get(impl)
        if r is not None:
            got = (r["full"] - base["full"], r["gate"] - base["gate"])
            checks.append({"impl": impl, "claim": f"+{full} full / +{gate} gate storages vs none", "measured": got,
                           "holds": got == (full, gate)})
    if paper_shape and batch64 is not None:
        paper = PAPER["depth8"]["64" if batch64 else "32"]
        for impl, r in compiled.items():
            if r is not None and impl in paper:
                checks.append({"impl": impl, "claim": f"{paper[impl]['full']} / {paper[impl]['gate']} storages "
                                                      f"(the paper's, torch 2.9.1)",
                               "measured": (r["full"], r["gate"]),
                               "holds": (r["full"], r["gate"]) == (paper[impl]["full"], paper[impl]["gate"])})
    held = sum(c["holds"] for c in checks)
    shape = "" if paper_shape else "; absolute counts only at the paper's shape (--preset gpu-d8 --batch 32 on CUDA)"
    text = (f"{'the paper’s counts hold' if held == len(checks) else 'the paper’s counts do not all hold'}: "
            f"{held} of {len(checks)} checks{shape}")
    return {"holds": held == len(checks), "checks": checks, "text": text}


def _paper_shape(setup: dict) -> bool:
    return all(setup[k] == v for k, v in PAPER_SHAPE.items()) and setup["batch"] in (32, 64)


def format_storage_table(result: dict) -> str:
    s, pb = result["setup"], result["paper_batch"]
    paper = result["paper"]["depth8"][str(pb)]  # keys are strings: the same in JSON
    same = "the paper's shape" if _paper_shape(s) else "not the paper's shape (depth 8, d 512, T 2048, bf16)"
    lines = [f"saved-storage audit (seed 000 Table 1): {s['source']}; L={s['n_layer']} d={s['n_embd']} "
             f"B={s['batch']} T={s['seq_len']} {s['dtype']} on {s['device']}, compiled with {s['backend']}, "
             f"torch {s['torch']}, {s['n_ve']} value-embedding layers; {same}",
             f"{'impl':<16}{'mode':<10}{'BTD / gate (MiB)':>24}{'storages':>10}{'peak MiB':>18}{'vs none':>12}"
             f"   paper B={pb}, torch 2.9.1: BTD/gate (MiB), peak, vs none"]
    for impl, per_mode in result["models"].items():
        for mode, r in per_mode.items():
            cell = f"{r['full']} / {r['gate']} ({r['full_mb'] + r['gate_mb']:.3f})"
            peak = NO_PEAK if r["peak_mib"] is None else f"{r['peak_mib']:.2f}"
            delta = "" if r.get("delta_mib") is None else f"{r['delta_mib']:+.2f}"
            p = paper.get(impl)
            ref = "" if p is None or mode != "compiled" else (
                f"   {p['full']}/{p['gate']} ({p['mb']:.1f}), {p['peak_mib']:.2f}, "
                f"{'-' if p['delta_mib'] is None else format(p['delta_mib'], '+.2f')}")
            lines.append(f"{impl:<16}{mode:<10}{cell:>24}{r['storages']:>10}{peak:>18}{delta:>12}{ref}")
    compiled = [r for per_mode in result["models"].values() for m, r in per_mode.items() if m == "compiled"]
    if compiled:
        lines.append("backward graph receives exactly the hooked storages: "
                     + ("yes" if all(r["bw_matches_hooks"] for r in compiled) else "NO"))
    for name, per_impl in result["blocks"].items():
        cells = ", ".join(f"{impl} {r['full']} BTD / {r['gate']} gate" for impl, r in per_impl.items())
        lines.append(f"single block ({name}, aot_eager_decomp_partition): {cells}  [paper, torch 2.9.1: "
                     f"{result['paper']['single_block'][name][0]} vs {result['paper']['single_block'][name][1]}]")
    p = result["predicted"]
    lines.append(f"predicted slice-view Delta = n_ve x B x T x d x 2 B: depth {p['depth']} ({p['n_ve']} ve layers), "
                 f"B={p['batch']}, T={p['seq_len']}, d={p['n_embd']}: {p['delta_mib']:.3f} MiB; "
                 f"at the audited shape {p['audit_delta_mib']:.6f} MiB")
    measured = p["measured_slice_minus_fused_mib"]
    lines.append("measured peak, unfused_slice - weight_fused (compiled): "
                 + (NO_PEAK if measured is None else f"{measured:+.3f} MiB"))
    v = result.get("verdict")
    if v:
        lines.append(f"verdict: {v['text']}")
        lines += [f"  {'holds' if c['holds'] else 'DIFFERS'}: {c['impl']} {c['claim']}, measured "
                  f"{c['measured'][0]} / {c['measured'][1]}" for c in v["checks"] if not c["holds"]]
    return "\n".join(lines)


COMMAND = Command(
    'storage', "saved-for-backward storages per pre-sublayer gains implementation (seed 000 §3.1, Table 1), "
    "compiled by Inductor, with the peak memory on CUDA",
    options=(("--preset", dict(default=None, help="audit this preset's GPT (gpu-d8: the paper's depth 8; "
        "default: a small CPU shape, L 4, d 128, B 2, T 48)")),
        ("--arm", dict(default=None, help="with --preset: the arm whose model is built (default baseline)")),
        ("--seed", dict(type=seed_value, default=None, help="init and tokens (default: the arm's seed, else 0)")),
        ("--depth", dict(type=integer_at_least(1), default=None, help="layers (default: the preset's, else 4)")),
        ("--batch", dict(type=integer_at_least(1), default=None,
        help="rows B (paper 32 and 64; default: the preset's device batch, else 2)")),
        ("--seq-len", dict(type=integer_at_least(1), default=None, help="T (default: the preset's, else 48)")),
        ("--device", dict(default=None, help="cpu, cuda, ... (default: the preset's, which for a GPU "
        "preset must be CUDA; without a preset cpu)")),
        ("--precision", dict(default=None, choices=("fp32", "bf16"),
        help="default: the preset's on the device (bf16 on CUDA), else "
        "bf16 on CUDA and fp32 elsewhere")),
        ("--backend", dict(default=None, choices=("inductor", "aot_eager"),
        help="the compiler (default inductor on CUDA, and on CPU where a C++ compiler "
        "exists; else aot_eager)"))),
    run=lambda a: run_storage_audit(
        preset=a.preset, arm=a.arm, seed=a.seed, depth=a.depth, batch=a.batch, seq_len=a.seq_len,
        device=a.device, precision=a.precision, backend=a.backend),
    format=format_storage_table)
