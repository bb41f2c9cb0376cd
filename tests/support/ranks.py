"""Shared test support: run a function on several gloo ranks in separate processes, and the
dyadic-gradient replay that makes multi-rank optimizer results comparable bit for bit.

Each run starts fresh rank processes (forked from a server that preloaded torch) under a hard
deadline, so a hang fails the test instead of blocking the suite. Ranks use one thread.
"""

import multiprocessing as mp
import socket
import time
import traceback
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from muonlab.device import one_intra_op_thread as one_thread
from muonlab.lab import warm_start
from muonlab.optim import MuonAdamW

DEADLINE_S = 120  # a whole spawn (start-up included); a hang fails the test after this


def dyadic_grad(p, rank, step, i):
    """A gradient of multiples of 1/16: sums of these are exact in any order, so results can be bitwise."""
    g = torch.Generator().manual_seed((step * 16 + rank) * 64 + i)
    return (torch.randint(-8, 9, p.shape, generator=g).float() / 16).to(p.dtype)  # exact in bf16 too


def dyadic_steps(opt, ps, rank: int, steps: int) -> list:
    """Step `opt` with rank `rank`'s dyadic gradients; the flat parameters after each step."""
    history = []
    for step in range(steps):
        for i, p in enumerate(ps):
            p.grad = dyadic_grad(p, rank, step, i)
        opt.step()
        history.append(flat(ps))
    return history


def averaged_replay(ps, groups, steps: int):
    """One process fed the 2-rank average of the dyadic gradients: (optimizer, history)."""
    with one_thread():
        opt = MuonAdamW(groups)
        history = []
        for step in range(steps):
            for i, p in enumerate(ps):
                p.grad = (dyadic_grad(p, 0, step, i) + dyadic_grad(p, 1, step, i)).div_(2)
            opt.step()
            history.append(flat(ps))
    return opt, history


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_entry(rank, world, port, fn, args, outdir):
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=60))
        result = fn(rank, world, *args)
        torch.save(result, Path(outdir) / f"rank{rank}.pt")
        dist.barrier()  # leave together: a peer tearing down early can abort gloo's threads
    except BaseException:
        (Path(outdir) / f"rank{rank}.err").write_text(traceback.format_exc())
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn, world, outdir: Path, *args, attempts: int = 2) -> list:
    """Run fn(rank, world, *args) on `world` gloo ranks; return each rank's result.

    The free port can be taken by another process between picking it and rank 0 binding it
    (other tests spawn ranks too), so a start that fails with EADDRINUSE is retried."""
    for attempt in range(attempts):
        try:
            return _run_ranks_once(fn, world, outdir / f"try{attempt}", *args)
        except _PortTaken:
            continue
    pytest.fail(f"no free port after {attempts} attempts")


class _PortTaken(Exception):
    pass


# Ranks start from a fork server that imported torch once (per test process), not a fresh
# interpreter each: a spawned rank spends seconds importing torch. The server forks before any
# test code runs in it, so no threads or CUDA state are inherited. A process has one fork server, whichever of
# this and a sweep's warm start (muonlab.lab.warm_start) asks first: both preloads in it, the sweep's last.
_PRELOAD = ["torch.distributed", *warm_start.PRELOAD]  # torch.distributed imports torch first


def _rank_context():
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def _run_ranks_once(fn, world, outdir: Path, *args) -> list:
    outdir.mkdir(parents=True)
    ctx = _rank_context()
    port = _free_port()
    procs = [ctx.Process(target=_rank_entry, args=(r, world, port, fn, args, str(outdir)), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + DEADLINE_S
    # poll, so that once one rank fails in Python the others (waiting on it) are stopped at once
    while (any(p.is_alive() for p in procs) and time.monotonic() < deadline
           and not any(outdir.glob("*.err"))):
        time.sleep(0.05)
    crashed = any(p.exitcode for p in procs) or any(outdir.glob("*.err"))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join()
    errors = "\n".join(f.read_text() for f in sorted(outdir.glob("*.err")))
    if "EADDRINUSE" in errors or "Address already in use" in errors:
        raise _PortTaken(errors)
    if hung and not crashed:
        pytest.fail(f"ranks {hung} still running after {DEADLINE_S}s (hang)\n{errors}")
    results = [outdir / f"rank{r}.pt" for r in range(world)]
    # a rank that finished, saved its result and passed the closing barrier may still be aborted by
    # gloo's teardown ("terminate called without an active exception"); its result stands
    if errors or not all(f.exists() for f in results):
        pytest.fail(f"exit codes {[p.exitcode for p in procs]}\n{errors}")
    return [torch.load(f, weights_only=True) for f in results]


def flat(params) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in params])


def unflat(vector, params) -> None:
    for p, v in zip(params, vector.split([p.numel() for p in params])):
        p.data.copy_(v.view_as(p))


def assert_state_equal(a, b):
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for i, sa in a["state"].items():
        assert sa.keys() == b["state"][i].keys(), i
        for k, v in sa.items():
            assert torch.equal(v, b["state"][i][k]) if torch.is_tensor(v) else v == b["state"][i][k], (i, k)
