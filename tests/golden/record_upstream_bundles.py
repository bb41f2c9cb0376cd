"""Record the small `autoresearch-reference/1` bundles that ship in tests/golden from upstream's own code.

The bundles are made by upstream karpathy/autoresearch's `GPT`, `GPTConfig` and `MuonAdamW`,
read at run time from the user's clone (nothing of upstream ships with muonlab), with only the
two changes of shared/reference/README.md: FlashAttention-3 is replaced by PyTorch SDPA with an
explicit causal sliding-window mask (query i sees keys j with i - left <= j <= i) and
torch.compile is off. Precision `fp32` casts the model to float32 after `init_weights()`;
`bf16` runs the forward under `torch.autocast("cpu", bfloat16)` with upstream's dtypes.

upstream's train.py is a script (it loads FA3 through `kernels`, imports `prepare`, trains at
top level), so only its definitions are executed: imports that can be imported (not `kernels`
or `prepare`), class and function definitions (torch.compile decorators dropped) and module
constants with literal values. The schedule is upstream's own `get_lr_multiplier`,
`get_muon_momentum` and `get_weight_decay`, applied to the groups as its loop does. Upstream's
progress is training time over a time budget; here it is the fixed-step progress s / steps
(as src/muonlab/reference/record.py with no untimed steps), so the warmdown is reached within
the few recorded steps. The optimizer arguments are upstream's own constants (EMBEDDING_LR, ...).
Tokens are random (no data set needed). Each bundle also keeps a `source` entry: the upstream
commit when PATH is a git checkout, the hash of its train.py and the torch version.

    python tests/golden/record_upstream_bundles.py --upstream /path/to/autoresearch [--out tests/golden]
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import io
import subprocess
import sys
import types
from pathlib import Path

import torch
import torch.nn.functional as F

from muonlab.reference.record import record_steps  # the bundle format's training loop
from muonlab.reference.verify import BUNDLE_FORMAT

# The smallest shape upstream allows (ve_gate reads 32 channels, so n_embd >= 32) that still
# has a sliding window shorter than the sequence (layer 0 "S": 8 of 16), GQA, value embeddings
# and rectangular MLP matrices (the Muon shape factor).
SHAPE_NAME = "d2e32"
MODEL_CONFIG = dict(sequence_len=16, vocab_size=64, n_layer=2, n_head=2, n_kv_head=1, n_embd=32,
                    window_pattern="SL")
STEPS, ACCUM, BATCH_SIZE, SEED = 3, 2, 2, 42
SKIPPED_IMPORTS = {"kernels", "prepare"}  # FA3 loader (replaced below) and upstream's data pipeline
REQUIRED = ("GPT", "GPTConfig", "MuonAdamW", "get_lr_multiplier", "get_muon_momentum", "get_weight_decay",
            "UNEMBEDDING_LR", "EMBEDDING_LR", "MATRIX_LR", "WEIGHT_DECAY", "ADAM_BETAS", "SCALAR_LR")


def sdpa_window_attention(q, k, v, causal=True, window_size=(-1, 0)):
    """FA3's flash_attn_func on [B, T, H, D] tensors, as SDPA with an explicit causal window mask."""
    assert causal and window_size[1] == 0, "upstream only uses causal left windows"
    T, left = q.size(1), window_size[0]
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    mask = (j <= i) & ((j >= i - left) if left >= 0 else True)
    y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       attn_mask=mask, enable_gqa=k.size(2) != q.size(2))
    return y.transpose(1, 2)


def _is_torch_compile(node: ast.expr) -> bool:
    target = node.func if isinstance(node, ast.Call) else node
    return isinstance(target, ast.Attribute) and target.attr == "compile" and \
        isinstance(target.value, ast.Name) and target.value.id == "torch"


def _is_literal_constant(node: ast.stmt) -> bool:
    if not (isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets)):
        return False
    try:
        ast.literal_eval(node.value)
    except ValueError:
        return False
    return True


def _importable(node: ast.Import | ast.ImportFrom, namespace: dict) -> bool:
    modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
    roots = [m.split(".")[0] for m in modules]
    if SKIPPED_IMPORTS.intersection(roots):
        return False
    try:
        exec(compile(ast.Module([node], []), "<import>", "exec"), dict(namespace))
    except ImportError:
        return False
    return True


def load_upstream(train_py: Path) -> types.ModuleType:
    """The definitions of upstream's train.py as a module, FA3 stubbed, torch.compile off."""
    tree = ast.parse(train_py.read_text(), filename=str(train_py))
    module = types.ModuleType("autoresearch_train")
    module.__file__ = str(train_py)
    module.fa3 = types.SimpleNamespace(flash_attn_func=sdpa_window_attention)
    kept = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            keep = _importable(node, module.__dict__)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            node.decorator_list = [d for d in node.decorator_list if not _is_torch_compile(d)]
            keep = True
        else:
            keep = _is_literal_constant(node)
        if keep:
            kept.append(node)
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    exec(compile(ast.Module(kept, []), str(train_py), "exec"), module.__dict__)
    return module


def check_upstream(module: types.ModuleType) -> None:
    missing = [n for n in REQUIRED if not hasattr(module, n)]
    if missing:
        raise SystemExit(f"error: {module.__file__} does not define {', '.join(missing)} "
                         "(not an autoresearch train.py?)")


def upstream_source(path: Path, train_py: Path) -> dict:
    """Which upstream the bundle came from: git commit (if a checkout) and train.py's hash."""
    def git(*args):
        run = subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True)
        return run.stdout.strip() if run.returncode == 0 else None
    top = git("rev-parse", "--show-toplevel")  # PATH itself a checkout, not a folder inside another
    commit = git("rev-parse", "HEAD") if top and Path(top).resolve() == path.resolve() else None
    return {"upstream_commit": commit,
            "upstream_train_py_modified": bool(git("status", "--porcelain", "--", "train.py")) if commit else None,
            "upstream_train_py_sha256": hashlib.sha256(train_py.read_bytes()).hexdigest(),
            "torch": str(torch.__version__), "recorder": "tests/golden/record_upstream_bundles.py",
            "progress": "fixed-step: step / steps", "seed": SEED}


def record(up: types.ModuleType, precision: str, source: dict) -> dict:
    """Train STEPS steps of upstream's model and optimizer on random tokens; return the bundle."""
    optimizer = dict(unembedding_lr=up.UNEMBEDDING_LR, embedding_lr=up.EMBEDDING_LR, matrix_lr=up.MATRIX_LR,
                     weight_decay=up.WEIGHT_DECAY, adam_betas=list(up.ADAM_BETAS), scalar_lr=up.SCALAR_LR)
    torch.manual_seed(SEED)
    model = up.GPT(up.GPTConfig(**MODEL_CONFIG))
    model.init_weights()
    if precision == "fp32":
        model.float()
    with contextlib.redirect_stdout(io.StringIO()):  # upstream prints its LR scaling
        opt = model.setup_optimizer(**{**optimizer, "adam_betas": tuple(optimizer["adam_betas"])})
    T, V = MODEL_CONFIG["sequence_len"], MODEL_CONFIG["vocab_size"]
    tokens = torch.randint(0, V, (STEPS + 1, ACCUM, BATCH_SIZE, T + 1))
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if precision == "bf16" else contextlib.nullcontext

    def upstream_schedule(opt, s: int) -> dict:  # as upstream's training loop sets the groups before step()
        progress = s / STEPS
        values = dict(lrm=up.get_lr_multiplier(progress), muon_momentum=up.get_muon_momentum(s),
                      muon_weight_decay=up.get_weight_decay(progress))
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] * values["lrm"]
            if group["kind"] == "muon":
                group["momentum"] = values["muon_momentum"]
                group["weight_decay"] = values["muon_weight_decay"]
        return values

    recorded = record_steps(model, opt, tokens, autocast, upstream_schedule)
    return {
        "format": BUNDLE_FORMAT, "model_config": dict(MODEL_CONFIG), "optimizer": optimizer,
        "precision": precision,
        "init_state_dict": recorded["steps"][0]["params"],  # the same tensors: torch.save stores them once
        **recorded,
        "source": source,
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", required=True, type=Path, help="a karpathy/autoresearch clone (or its train.py)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    args = ap.parse_args(argv)
    root = args.upstream.parent if args.upstream.name == "train.py" else args.upstream
    train_py = root / "train.py"
    if not train_py.is_file():
        raise SystemExit(f"error: no train.py in {root}")
    up = load_upstream(train_py)
    check_upstream(up)
    source = upstream_source(root, train_py)
    for precision in ("fp32", "bf16"):
        path = args.out / f"upstream_{SHAPE_NAME}_{precision}.pt"
        torch.save(record(up, precision, source), path)
        print(f"{path}  {path.stat().st_size / 1024:.0f} KiB  upstream {source['upstream_commit']}  "
              f"torch {torch.__version__}")


if __name__ == "__main__":
    main()
