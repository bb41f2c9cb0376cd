"""A run's final weights in safetensors, the format the rest of the ecosystem reads without
unpickling anything: `model.safetensors` beside `model.pt` in the run directory.

safetensors stores each tensor once, so a tensor two names share (a tied embedding and head) is
written under its first name and the others are recorded as aliases in the file's metadata, with
what a reader needs to rebuild the model: muonlab's format, the model family, the vocabulary size
and the run's config hash (muonlab.load_run reads them with the run's config.json)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
# at import, with torch as it is: safetensors keys its dtype tables by torch's dtype objects (a test that
# swaps torch's dtypes for float64 while the first weights are written would leave them keyed wrongly)
from safetensors import SafetensorError, safe_open
from safetensors.torch import save

from muonlab.atomic import atomic_open
from muonlab.errors import CorruptInput

FORMAT = "muonlab-weights/1"
ALIASES_KEY = "aliases"  # metadata: {name: the name whose tensor it shares}


def save_safetensors(state: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> Path:
    """Write `state` (a state dict) atomically; tensors shared by several names are stored once."""
    tensors, aliases, first = {}, {}, {}
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
               tuple(tensor.stride()), tensor.dtype)
        if key in first:
            aliases[name] = first[key]
            continue
        first[key] = name
        tensors[name] = tensor.detach().to("cpu", copy=True).contiguous()  # its own storage: no overlaps
    blob = save(tensors, metadata={"format": "pt", "muonlab": FORMAT, **metadata, ALIASES_KEY: json.dumps(aliases)})
    with atomic_open(path, "wb") as f:
        f.write(blob)
    return path


def load_safetensors(path: Path, device: str | torch.device = "cpu") -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(the state dict with every alias restored, the file's metadata)."""
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            metadata = f.metadata() or {}
            state = {name: f.get_tensor(name) for name in f.keys()}
    except SafetensorError as exc:
        raise CorruptInput(f"{path} is damaged ({exc}): restore it, or remove it to read the run's model.pt") from None
    for alias, name in json.loads(metadata.get(ALIASES_KEY, "{}")).items():
        state[alias] = state[name]
    return state, metadata
