"""DistMuonAdamW: MuonAdamW that averages gradients across ranks itself and shards its state.

The design follows nanochat's distributed MuonAdamW (karpathy/nanochat `nanochat/optim.py`,
itself adapted from modded-nanogpt's DistAdam/Muon): no DDP gradient all-reduce in the
training loop; the optimizer owns communication, and each rank updates only a share of the
parameters (ZeRO-1: optimizer state is sharded, parameters and gradients are not).

With no process group, or a world of one, `step`, `state_dict` and `load_state_dict` are
MuonAdamW's own code paths: no communication, same numbers, same checkpoint format.

Step with world size W > 1 (each rank holds its own mean gradient, not yet averaged):
  0. One small blocking all_reduce of a has-gradient flag per parameter, so every rank takes
     the same decisions: a parameter is stepped iff some rank has a gradient for it; a rank
     without one contributes zeros. The average is sum / W over all ranks, i.e. exactly the
     gradient of the global mean loss when every rank's loss averages the same number of
     tokens (a parameter unused on a rank's micro-batches has zero gradient there).
     Parameters with no gradient on any rank are skipped (as MuonAdamW skips grad None);
     a muon group where only some matrices have a gradient anywhere raises on every rank
     (MuonAdamW raises too), before any other collective, so nothing hangs.
  1. Launch every reduction asynchronously (sum; divided by W on arrival, the same formula
     on every backend so results do not depend on how a backend implements AVG):
       - muon group of N matrices: stack the gradients, zero-pad to ceil(N/W)*W matrices,
         reduce-scatter; rank r owns matrices [r*ceil(N/W), (r+1)*ceil(N/W)) ∩ [0, N).
       - adamw param with >= ADAMW_SHARD_MIN_NUMEL elements and shape[0] % W == 0:
         reduce-scatter along dim 0 (rank r owns rows [r*R/W, (r+1)*R/W)); else all_reduce
         (small tensors: one message beats three, and their replicated state is tiny).
         Exception: a param of an adamw group whose gradient transform needs the whole tensor
         (`whole_tensor`, method_points.adamw_transform) is always
         all_reduced; every rank transforms the full tensor (identical bits on every rank) and
         then updates only its rows, so its state stays row-sharded exactly as without it.
       - a third group kind (method_points.GROUP_KINDS): replicated; its gradient and the
         kind's `reduced_alongside` tensors (e.g. visit counts) are all_reduced.
  2. Per group, in order: wait for its reductions, run MuonAdamW's own step function for the
     group (upstream `muon_step` / `adamw_step`, or the variant composed from its add-ons; the
     same call MuonAdamW makes) on this rank's share with this rank's state, and launch the
     all-gather of the updated values.
  3. Wait for every all-gather and copy the gathered matrices into the parameters.
Every buffer a collective reads or writes is held in a Python list until its wait() returns
(freeing one early is the known use-after-free with async collectives). `p.grad` is never
modified: it stays the rank-local gradient.

Numerics: Muon's and AdamW's math act per matrix / per element, so updating a share gives the
bits of updating the whole, given the same averaged gradient (the tests check this bitwise).
For W = 2 the sum g0 + g1 is commutative, hence the same bits whichever way a backend adds,
so a 2-rank step equals MuonAdamW fed (g0 + g1) / 2 bit for bit; for W > 2 the backend's
summation order may move the last bit of the average (and Polar Express in bf16 can amplify it).

Checkpoint layout:
  - `state_dict()` (no communication): this rank's shard in torch's Optimizer format plus
    `"distributed": {"layout": "rank_shard", "rank": r, "world_size": W}`. A muon group's
    state lives on its first parameter (as in MuonAdamW) with `momentum_buffer`
    [n_owned, rows, cols] and `second_momentum_buffer` [n_owned, rows, 1] (tall) or
    [n_owned, 1, cols] (wide), n_owned possibly 0 (a stateful pre-polar conditioner's buffer,
    e.g. `zeta_buffer` [n_owned, rows, cols], likewise; its step counter is replicated); a
    row-sharded adamw param has `exp_avg`/`exp_avg_sq` (and an fp32 `master`) of its
    rows only; `step` is replicated. It only loads back on the same rank of the same world size. With W = 1 it is exactly MuonAdamW.state_dict().
  - `full_state_dict()` (collective: every rank must call it): the shards gathered into
    exactly MuonAdamW.state_dict()'s layout ([N, ...] buffers, full-shape AdamW moments),
    independent of W, returned on every rank (save it from rank 0).
  - `load_full_state_dict(sd)` (no communication): every rank reads the same full dict and
    keeps its shard, for any W. `load_state_dict(sd)` dispatches on the "distributed" key,
    so a full dict or this rank's own shard both load through it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from muonlab.optim import collectives, extensions
from muonlab.optim.method_points import GROUP_KINDS, adamw_transform
from muonlab.optim.muon_adamw import MuonAdamW

# nanochat's cut-off: below it one all_reduce beats reduce-scatter + all-gather, and the
# replicated AdamW state costs nothing worth sharding
ADAMW_SHARD_MIN_NUMEL = 1024



def group_world(process_group=None) -> tuple[int, int]:
    """(rank, world size) in the process group, (0, 1) when torch.distributed is not in use."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(process_group), dist.get_world_size(process_group)


def owned_range(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """The matrices [start, stop) of an n-stack that `rank` owns: contiguous chunks of ceil(n/W)."""
    chunk = -(-n // world_size)
    start = min(n, rank * chunk)
    return start, min(n, start + chunk)


def adamw_is_sharded(p: torch.Tensor, world_size: int) -> bool:
    """Whether an adamw parameter's gradient is reduce-scattered and its state row-sharded."""
    return (world_size > 1 and p.dim() >= 1 and p.numel() >= ADAMW_SHARD_MIN_NUMEL
            and p.shape[0] % world_size == 0)


def _snapshot(param_state: dict) -> dict:
    return {k: (v.clone() if torch.is_tensor(v) else v) for k, v in param_state.items()}


class DistMuonAdamW(MuonAdamW):
    """MuonAdamW over `torch.distributed` ranks (NCCL on GPU, gloo on CPU); see the module doc.

    Args:
        param_groups, compile: as MuonAdamW.
        process_group: the data-parallel group (default: the world). Every rank of it must
            call `step()` and `full_state_dict()` together.
    """

    def __init__(self, param_groups, compile: bool | None = None, process_group=None):
        super().__init__(param_groups, compile=compile)
        self.process_group = process_group

    def world(self) -> tuple[int, int]:
        return group_world(self.process_group)

    def _params(self) -> list[torch.Tensor]:
        # the order torch's Optimizer.state_dict numbers parameters in
        return [p for group in self.param_groups for p in group["params"]]

    # ---------------------------------------------------------------- step

    always_collective = False  # a world of one runs the N-rank step (runtime.collectives = always)

    def _one_process(self, world: int) -> bool:
        return world == 1 and not self.always_collective

    @torch.no_grad()
    def step(self, closure=None):
        rank, world = self.world()
        if self._one_process(world):
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        stepped = self._agree_on_gradients()
        # phase 1: launch every reduction before any compute
        reductions = [self._launch_reduce(group, stepped, world) for group in self.param_groups]
        # phase 2: per group, wait, update this rank's share, launch its all-gather
        gathers: list[dict] = []
        for group, red in zip(self.param_groups, reductions):
            if group["kind"] == "adamw":
                self._update_adamw(group, red, rank, world, gathers)
            elif group["kind"] == "muon":
                if red is not None:
                    self._update_muon(group, red, rank, world, gathers)
            else:
                self._update_kind(group, red, world)
        # phase 3: wait for the gathers, copy stacked matrices back
        for g in gathers:
            g["work"].wait()
            if "params" in g:
                torch._foreach_copy_(g["params"], list(g["out"][:len(g["params"])].unbind(0)))
        return loss

    def _agree_on_gradients(self) -> set[int]:
        """ids of the parameters some rank has a gradient for (the same set on every rank)."""
        params = self._params()
        if not params:
            return set()
        flags = collectives.comm_tensor([p.grad is not None for p in params], torch.int32, self.process_group)
        collectives.all_reduce(flags, group=self.process_group)
        stepped = {id(p) for p, f in zip(params, flags.tolist()) if f > 0}
        for group in self.param_groups:
            n = sum(id(p) in stepped for p in group["params"])
            if group["kind"] == "muon" and 0 < n < len(group["params"]):
                # every rank sees the same flags, so every rank raises here: no hang
                raise RuntimeError("DistMuonAdamW: some matrices of a muon group have no gradient on any rank")
        return stepped

    def _launch_reduce(self, group, stepped: set[int], world: int):
        """Start the asynchronous reductions of one group; returns what phase 2 needs."""
        if group["kind"] not in ("muon", "adamw"):
            # replicated: all-reduce the gradient and the kind's own tensors (their sums are the
            # global batch's), then every rank applies the same update (no sharding)
            handler = GROUP_KINDS[group["kind"]]
            pending = []
            for p in group["params"]:
                extra = handler.reduced_alongside(self, p)
                grad = p.grad.clone() if p.grad is not None else torch.zeros_like(p)
                works = [collectives.all_reduce(t, group=self.process_group, async_op=True) for t in (grad, *extra)]
                pending.append(dict(p=p, works=works, grad=grad, keep=extra))
            return pending
        if group["kind"] == "adamw":
            transform = adamw_transform(group)
            whole = transform is not None and transform.whole_tensor
            pending = []
            for p in group["params"]:
                if id(p) not in stepped:
                    continue
                grad = p.grad.contiguous() if p.grad is not None else torch.zeros_like(p)
                if adamw_is_sharded(p, world) and not whole:
                    out = grad.new_empty(p.shape[0] // world, *p.shape[1:])
                    work = collectives.reduce_scatter(out, grad, group=self.process_group, async_op=True)
                else:
                    out = grad.clone() if grad is p.grad else grad  # never modify p.grad
                    work = collectives.all_reduce(out, group=self.process_group, async_op=True)
                pending.append(dict(p=p, work=work, out=out, keep=grad))
            return pending
        params = group["params"]
        if not params or id(params[0]) not in stepped:
            return None
        n, chunk = len(params), -(-len(params) // world)
        p0 = params[0]
        stack = p0.new_empty(chunk * world, *p0.shape)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        torch.stack(grads, out=stack[:n])
        stack[n:].zero_()  # padding matrices: zero, never updated
        out = p0.new_empty(chunk, *p0.shape)
        work = collectives.reduce_scatter(out, stack, group=self.process_group, async_op=True)
        return dict(work=work, out=out, stack=stack)

    def _update_adamw(self, group, pending, rank, world, gathers):
        transform = adamw_transform(group)
        for item in pending:
            item["work"].wait()
            p, grad = item["p"], item["out"].div_(world)
            sharded = adamw_is_sharded(p, world)
            rows = p.shape[0] // world if sharded else None
            p_share = p[rank * rows:(rank + 1) * rows] if sharded else p
            # moments (and a state precision's tensor, e.g. an fp32 master) are made for this
            # rank's rows: row-sharded
            state = self._adamw_state(group, p, p_share)
            if state["exp_avg"].shape != p_share.shape:
                raise RuntimeError("DistMuonAdamW: optimizer state was made for another world size; "
                                   "move it with full_state_dict() / load_full_state_dict()")
            state["step"] += 1
            if transform is not None:  # on the averaged tensor it was reduced to, then this rank's rows
                grad = transform.apply(grad, state["step"], group)
                if sharded and transform.whole_tensor:
                    grad = grad[rank * rows:(rank + 1) * rows]
            self._adamw_update(group, p_share, grad, state)
            if sharded:
                send = p_share.clone()  # the gather writes into p, so it must not read from p
                work = collectives.all_gather(p, send, group=self.process_group, async_op=True)
                gathers.append(dict(work=work, keep=send))

    def _update_kind(self, group, pending, world):
        handler = GROUP_KINDS[group["kind"]]
        for item in pending:
            for work in item["works"]:
                work.wait()
            handler.update(self, group, item["p"], item["grad"].div_(world))

    def _update_muon(self, group, red, rank, world, gathers):
        red["work"].wait()
        params = group["params"]
        p0 = params[0]
        rows, cols = p0.shape
        n, chunk = len(params), red["out"].size(0)
        start, stop = owned_range(n, rank, world)
        owned = stop - start
        state = self.state[p0]
        if "momentum_buffer" not in state:  # zero-size on a rank that owns nothing, so every rank has state
            state["momentum_buffer"] = p0.new_zeros(owned, rows, cols)
        if "second_momentum_buffer" not in state:
            state["second_momentum_buffer"] = p0.new_zeros((owned, rows, 1) if rows >= cols else (owned, 1, cols))
        if state["momentum_buffer"].size(0) != owned:
            raise RuntimeError("DistMuonAdamW: optimizer state was made for another world size; "
                               "move it with full_state_dict() / load_full_state_dict()")
        send = p0.new_empty(chunk, rows, cols)
        # every rank advances the add-ons' step counter (and makes their state), owner or not
        fn, extra = self._muon_call(group, state, start, stop, p0.device)
        if owned:
            grads = red["out"][:owned].div_(world)
            torch.stack(params[start:stop], out=send[:owned])
            self._fill_muon(group, rows, cols)
            fn(grads, send[:owned], state["momentum_buffer"], state["second_momentum_buffer"],
               self._muon_momentum_t, self._muon_lr_t, self._muon_wd_t, self._muon_beta2_t,
               group["ns_steps"], -1 if rows >= cols else -2, *extra)
        send[owned:].zero_()
        # the reduce-scatter has completed, so its input stack is free to receive the gather
        work = collectives.all_gather(red["stack"], send, group=self.process_group, async_op=True)
        gathers.append(dict(work=work, keep=send, out=red["stack"], params=params))

    # ---------------------------------------------------------------- checkpoints

    def state_dict(self):
        """This rank's shard (see the module doc); exactly MuonAdamW's dict when W = 1."""
        sd = super().state_dict()
        rank, world = self.world()
        if world > 1:
            sd["distributed"] = {"layout": "rank_shard", "rank": rank, "world_size": world}
        return sd

    def load_state_dict(self, state_dict):
        """Load this rank's own shard, or a full (world-size-independent) dict via load_full_state_dict."""
        info = state_dict.get("distributed")
        if info is None:
            return self.load_full_state_dict(state_dict)
        rank, world = self.world()
        if (info["rank"], info["world_size"]) != (rank, world):
            raise ValueError(f"optimizer shard of rank {info['rank']} of {info['world_size']} cannot load on rank "
                             f"{rank} of {world}; save full_state_dict() to change the world size")
        return super().load_state_dict({k: v for k, v in state_dict.items() if k != "distributed"})

    def full_state_dict(self) -> dict:
        """The whole optimizer state in MuonAdamW.state_dict()'s layout. Collective when W > 1.

        Unlike state_dict() (torch's convention: references to the live state), this is a
        snapshot of fresh tensors, so it stays valid while training continues.
        """
        local = super().state_dict()
        rank, world = self.world()
        if self._one_process(world):
            return {"state": {i: _snapshot(s) for i, s in local["state"].items()},
                    "param_groups": local["param_groups"]}
        params = self._params()
        self._check_state_agrees(params)
        index = {id(p): i for i, p in enumerate(params)}
        stacked = extensions.stacked_state_keys()
        full = {}
        for group in self.param_groups:
            for j, p in enumerate(group["params"]):
                i = index[id(p)]
                if i not in local["state"]:
                    continue
                s = local["state"][i]
                if group["kind"] == "muon" and j == 0:
                    n = len(group["params"])
                    # per-matrix buffers (momentum, NorMuon, a conditioner's) gathered to [N, ...];
                    # scalars (the conditioner's step counter) are replicated
                    full[i] = {k: (self._gather_rows(v, -(-n // world), world, n)
                                   if k in stacked else v) for k, v in s.items()}
                elif group["kind"] == "adamw" and adamw_is_sharded(p, world):
                    rows = p.shape[0] // world
                    # moments (and an fp32 master) are row-sharded; `step` is replicated
                    full[i] = {k: (self._gather_rows(v, rows, world, p.shape[0]) if torch.is_tensor(v) else v)
                               for k, v in s.items()}
                else:
                    full[i] = _snapshot(s)  # replicated: identical on every rank
        return {"state": full, "param_groups": local["param_groups"]}

    def load_full_state_dict(self, state_dict) -> None:
        """Load a full dict (from full_state_dict or MuonAdamW), keeping this rank's shard. No communication."""
        rank, world = self.world()
        if self._one_process(world):
            return super().load_state_dict(state_dict)
        params = self._params()
        index = {id(p): i for i, p in enumerate(params)}
        stacked = extensions.stacked_state_keys()
        shard = {}
        for group in self.param_groups:
            for j, p in enumerate(group["params"]):
                i = index[id(p)]
                if i not in state_dict["state"]:
                    continue
                s = state_dict["state"][i]
                if group["kind"] == "muon" and j == 0:
                    n = len(group["params"])
                    if s["momentum_buffer"].size(0) != n:
                        raise ValueError(f"muon state of param {i} holds {s['momentum_buffer'].size(0)} "
                                         f"matrices, the group has {n}")
                    start, stop = owned_range(n, rank, world)
                    shard[i] = {k: (v[start:stop].clone() if k in stacked else v)
                                for k, v in s.items()}
                elif group["kind"] == "adamw" and adamw_is_sharded(p, world):
                    rows = p.shape[0] // world
                    shard[i] = {k: (v[rank * rows:(rank + 1) * rows].clone() if torch.is_tensor(v) else v)
                                for k, v in s.items()}
                else:
                    shard[i] = _snapshot(s)
        super().load_state_dict({"state": shard, "param_groups": state_dict["param_groups"]})

    def _check_state_agrees(self, params) -> None:
        """Every rank must hold state for the same parameters, or the gathers below would hang."""
        if not params:
            return
        has = collectives.comm_tensor([bool(self.state.get(p)) for p in params], torch.int32, self.process_group)
        collectives.all_reduce(has, group=self.process_group)
        _, world = self.world()
        if ((has > 0) & (has < world)).any():
            raise RuntimeError("DistMuonAdamW.full_state_dict: ranks disagree on which parameters have state")

    def _gather_rows(self, local: torch.Tensor, chunk: int, world: int, n: int) -> torch.Tensor:
        """The first n rows of every rank's rows (each padded to `chunk`) concatenated along dim 0."""
        send = local.new_zeros(chunk, *local.shape[1:])
        send[:local.size(0)] = local
        out = local.new_empty(chunk * world, *local.shape[1:])
        collectives.all_gather(out, send, group=self.process_group)
        return out if n == out.size(0) else out[:n].clone()  # a view would save the padding too
