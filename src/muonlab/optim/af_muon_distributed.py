"""DistAFMuon: AF-Muon (and its Hybrid / Sign / factorial baselines) across torch.distributed ranks.

Like DistMuonAdamW, the optimizer owns the communication (no DDP in the loop), and each rank updates
only its share of the parameters, keeping the state of that share (ZeRO-1):
  - "matrix" tensors are owned whole, in contiguous chunks of ceil(N / W) of each group's list, so each
    rank orthogonalises whole matrices (seed 004 §2.2's Newton–Schulz never sees a fraction);
  - the tied table, and any other 2-D tensor of a row-wise or element-wise rule (Hybrid's AdamW tables),
    is row-sharded: rank r owns rows [r c, (r + 1) c), c = ceil(V / W); the clipped-row LMO (eq. 4-5),
    heavy-ball momentum and AdamW act per row or element, so a shard's update is the whole's rows;
  - 1-D tensors (the RMS-normalised vectors, whose norm is over the whole tensor) are updated by every
    rank alike (replicated state: they are tiny).

A step with W > 1 ranks (each holds the mean gradient of its own micro-batches):
  0. one all_reduce of a has-gradient flag per tensor, so that every rank steps the same tensors (a
     tensor with a gradient on some rank is stepped; a rank without one contributes zeros);
  1. one all_reduce (sum) of every stepped gradient, flattened into one buffer, divided by W on arrival,
     written back to `.grad` (from here `.grad` is the global mean gradient, on every rank);
  2. gradient clipping (`max_grad_norm`, seed 004 §3.1) on that mean gradient with the single-process
     call (`clip_grad_norm_` over `clip_params`, the model's parameter order), so the norm is the one a
     single process computes;
  3. each rank updates its share (AFMuon._update: the single-process arithmetic);
  4. one all_gather of every rank's updated share, flattened and padded to the longest, copied back.
Numerics: with W = 2 and one micro-batch per rank, (g0 + g1) / 2 is exactly the single process's
g0 / 2 + g1 / 2 (a halving is exact and a sum of two is commutative), the clip and every update are the
same arithmetic on the same values: a 2-rank run equals the 1-process run bit for bit (tested on CPU).
With more micro-batches per rank, or W > 2, the sum's order moves the gradient's last bit.

Checkpoints: `full_state_dict()` (collective) gathers the shards into exactly AFMuon.state_dict()'s
layout, independent of W; `load_state_dict` takes that layout on any W and keeps this rank's share
(`state_dict()` is torch's, this rank's share only, and is not meant to be saved).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from muonlab.optim.af_muon import AFMuon
from muonlab.optim import collectives
from muonlab.optim.distributed import group_world


class DistAFMuon(AFMuon):
    """AFMuon over the ranks of `process_group` (default: the world); see the module docstring."""

    def __init__(self, params, *, max_grad_norm: float | None = None, clip_params=None, process_group=None,
                 **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        self.max_grad_norm = max_grad_norm
        self.last_grad_norm: Tensor | None = None  # the mean gradient's norm before the clip, at the last step
        self.clip_params = list(clip_params) if clip_params is not None else None
        self.process_group = process_group

    def world(self) -> tuple[int, int]:
        return group_world(self.process_group)

    # --- who owns what -------------------------------------------------------------------------
    def _entries(self) -> list[tuple[dict, Tensor, str, Any]]:
        """(group, param, layout, where) in parameter order; layout "whole" (where = owner rank),
        "rows" (where = rows per rank) or "all"."""
        _, W = self.world()
        out = []
        for g in self.param_groups:
            params = g["params"]
            chunk = math.ceil(len(params) / W) if params else 1
            for i, p in enumerate(params):
                if g["role"] == "matrix":
                    out.append((g, p, "whole", i // chunk))
                elif p.ndim >= 2:
                    out.append((g, p, "rows", math.ceil(p.shape[0] / W)))
                else:
                    out.append((g, p, "all", None))
        return out

    @staticmethod
    def _share(p: Tensor, layout: str, where: Any, rank: int) -> Tensor | None:
        """This rank's share of p (a view), or None."""
        if layout == "whole":
            return p if where == rank else None
        if layout == "rows":
            return p[min(rank * where, p.shape[0]):min((rank + 1) * where, p.shape[0])]
        return p

    # --- the step ----------------------------------------------------------------------------
    def _clip(self) -> Tensor:
        """Clip the (mean) gradient when max_grad_norm is set; its norm before the clip either way (logged
        as the step's gradient norm, seed 004 Table 13)."""
        params = self.clip_params or self._all_params()
        if self.max_grad_norm:
            return torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        return torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])

    always_collective = False  # a world of one runs the N-rank step (runtime.collectives = always)

    def _one_process(self, world: int) -> bool:
        return world == 1 and not self.always_collective

    @torch.no_grad()
    def step(self, closure=None):
        rank, W = self.world()
        if self._one_process(W):
            self.last_grad_norm = self._clip()
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        entries = self._entries()
        self._average_gradients([p for _, p, _, _ in entries])
        self.last_grad_norm = self._clip()  # every rank holds the mean gradient: one norm
        for g, p, layout, where in entries:
            share = self._share(p, layout, where, rank)
            if p.grad is None or share is None or share.numel() == 0:
                continue
            grad = self._share(p.grad, layout, where, rank).float()
            self._update(g, share, grad, self._state(p, g["role"], like=share))
        self._gather(entries, [[p] for _, p, _, _ in entries], rank, W)
        return loss

    def _all_params(self) -> list[Tensor]:
        return [p for g in self.param_groups for p in g["params"]]

    def _average_gradients(self, params: list[Tensor]) -> None:
        _, W = self.world()
        flags = collectives.comm_tensor([p.grad is not None for p in params], torch.float32, self.process_group)
        collectives.all_reduce(flags, group=self.process_group)
        stepped = [p for p, f in zip(params, flags.tolist()) if f > 0]
        if not stepped:
            return
        for p in stepped:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            if p.grad.is_sparse:
                p.grad = p.grad.to_dense()
        buffer = torch.cat([p.grad.reshape(-1).float() for p in stepped])
        collectives.all_reduce(buffer, group=self.process_group)
        buffer.div_(W)
        offset = 0
        for p in stepped:
            n = p.numel()
            p.grad.copy_(buffer[offset:offset + n].view_as(p.grad))
            offset += n

    def _gather(self, entries, tensors_of: list[list[Tensor]], rank: int, W: int) -> None:
        """All-gather every rank's share of each tensor in `tensors_of[i]` (tensors shaped like entry i's
        parameter, or its row shard) and write the other ranks' shares in place on every rank."""
        def pieces(r: int) -> list[tuple[Tensor, Tensor]]:  # (full tensor, rank r's share of it)
            out = []
            for (_, p, layout, where), tensors in zip(entries, tensors_of):
                if layout == "all":
                    continue
                for t in tensors:
                    share = self._share(t, layout, where, r)
                    if share is not None and share.numel():
                        out.append((t, share))
            return out
        sizes = [sum(s.numel() for _, s in pieces(r)) for r in range(W)]
        if max(sizes) == 0:
            return
        dtype = next(s.dtype for r in range(W) for _, s in pieces(r))
        mine = pieces(rank)
        local = torch.zeros(max(sizes), dtype=dtype, device=entries[0][1].device)
        if mine:
            flat = torch.cat([s.reshape(-1).to(dtype) for _, s in mine])
            local[:flat.numel()] = flat
        gathered = torch.empty(W * max(sizes), dtype=dtype, device=local.device)
        collectives.all_gather(gathered, local, group=self.process_group)
        for r in range(W):
            if r == rank:
                continue
            offset = r * max(sizes)
            for _, share in pieces(r):
                n = share.numel()
                share.copy_(gathered[offset:offset + n].view_as(share))
                offset += n

    # --- checkpoints ---------------------------------------------------------------------------
    def full_state_dict(self) -> dict:
        """Every rank's shares gathered into AFMuon.state_dict()'s layout (collective)."""
        rank, W = self.world()
        if self._one_process(W):
            return super().state_dict()
        entries = self._entries()
        has = collectives.comm_tensor([bool(self.state.get(p)) for _, p, _, _ in entries], torch.float32,
                                     self.process_group)
        collectives.all_reduce(has, group=self.process_group)
        full: dict[Tensor, dict[str, Any]] = {}
        tensors_of = []
        for (g, p, layout, where), h in zip(entries, has.tolist()):
            if not h:
                tensors_of.append([])
                continue
            keys = ("exp_avg", "exp_avg_sq") if g["role"] == "adamw" else ("momentum_buffer",)
            st = self.state.get(p, {})
            full[p] = {}
            if g["role"] == "adamw":  # replicated counter: every rank steps the same tensors
                step = collectives.comm_tensor([float(st.get("step", 0))], torch.float32, self.process_group)
                collectives.all_reduce(step, op=dist.ReduceOp.MAX, group=self.process_group)
                full[p]["step"] = int(step.item())
            for key in keys:
                t = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
                share = self._share(t, layout, where, rank)
                if share is not None and key in st:
                    share.copy_(st[key])
                full[p][key] = t
            tensors_of.append([full[p][k] for k in keys])
        self._gather(entries, tensors_of, rank, W)
        saved = self.state
        self.state = defaultdict(dict, full)
        try:
            return super().state_dict()
        finally:
            self.state = saved

    def load_state_dict(self, state_dict: dict) -> None:
        """The full (world-size independent) layout; this rank keeps its share."""
        super().load_state_dict(state_dict)
        rank, W = self.world()
        if self._one_process(W):
            return
        for g, p, layout, where in self._entries():
            st = self.state.get(p)
            if not st:
                continue
            share = self._share(p, layout, where, rank)
            if share is None:
                del self.state[p]
                continue
            for key, value in list(st.items()):
                if torch.is_tensor(value) and value.shape == p.shape and layout == "rows":
                    st[key] = self._share(value, layout, where, rank).clone()
