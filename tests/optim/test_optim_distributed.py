"""DistMuonAdamW against MuonAdamW: 2- and 3-rank gloo runs on CPU in spawned processes.

Each multi-process test runs its ranks in fresh `spawn` processes under a hard deadline, so a
hang fails the test instead of blocking the suite. Ranks use one thread; the single-process
references computed here use one thread too, so no kernel can pick a different reduction
order for a different thread count.

Exactness: for W = 2 the gradient sum g0 + g1 is commutative, hence bitwise the same on every
backend, and the optimizer's math is per matrix / per element, so a 2-rank step must equal
MuonAdamW fed (g0 + g1) / 2 bit for bit. Tests with W = 3 use dyadic gradients (k/16 with
small k), whose sums are exact in any order, so they can demand bitwise equality too.
"""

import copy

import pytest
import torch
import torch.distributed as dist

from muonlab.optim import MuonAdamW
from muonlab.optim.distributed import DistMuonAdamW, adamw_is_sharded, owned_range
from support.ranks import assert_state_equal, flat, one_thread, run_ranks, unflat

# ---------------------------------------------------------------- a small GPT

def _gpt():
    from muonlab.model import GPT, GPTConfig

    torch.manual_seed(0)  # the same init on every rank and here
    model = GPT(GPTConfig(sequence_len=16, vocab_size=64, n_layer=2, n_head=2, n_kv_head=2, n_embd=64,
                          attn_backend="sdpa"))
    model.init_weights()
    return model.float()


def _gpt_groups(model):
    return model.setup_optimizer(matrix_lr=0.04, embedding_lr=0.6, weight_decay=0.2).param_groups


def _global_batch(step):
    data = torch.randint(0, 64, (4, 17), generator=torch.Generator().manual_seed(100 + step))
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


def _gpt_worker(rank, world, steps):
    """Each rank: mean loss over its rows r::W of the global batch, then a DistMuonAdamW step."""
    model = _gpt()
    opt = DistMuonAdamW(_gpt_groups(model))
    out = {"grads": [], "params": [], "grads_untouched": True}
    for step in range(steps):
        x, y = _global_batch(step)
        model(x[rank::world].contiguous(), y[rank::world].contiguous()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        out["grads_untouched"] &= all(torch.equal(p.grad, grads[n]) for n, p in model.named_parameters())
        if step < 3:
            out["grads"].append(grads)
        out["params"].append(flat(model.parameters()))
        model.zero_grad(set_to_none=True)
    return out


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    return run_ranks(_gpt_worker, 2, tmp_path_factory.mktemp("gpt") / "ranks", 20)


def test_two_rank_step_equals_one_rank_step(gpt_run):
    """Bitwise, for 3 steps, against MuonAdamW fed the averaged rank gradients (g0 + g1) / 2.

    Against MuonAdamW on the full batch the first step agrees within 1e-2 relative update
    error ||p - p_ref|| / ||p_ref - p_before||: the full-batch fp32 gradient differs from the
    average of the half-batch gradients in the last bits. Later steps are not compared that
    way: at init the zero-initialised projections leave many gradients near zero (the
    residual scalars' at ~1e-10, Adam's eps), whose normalised updates (Polar Express, Adam)
    are set by those last bits, so even a single process that merely splits the batch drifts
    ~5% from the full-batch run by step 3; the bitwise check covers the optimizer there."""
    with one_thread():
        model = _gpt()
        opt = MuonAdamW(_gpt_groups(model))
        for step in range(3):
            for n, p in model.named_parameters():
                p.grad = (gpt_run[0]["grads"][step][n] + gpt_run[1]["grads"][step][n]).div_(2)
            opt.step()
            assert torch.equal(flat(model.parameters()), gpt_run[0]["params"][step]), step

        model = _gpt()
        opt = MuonAdamW(_gpt_groups(model))
        before = flat(model.parameters())
        x, y = _global_batch(0)
        model(x, y).backward()
        opt.step()
        after = flat(model.parameters())
        err = (after - gpt_run[0]["params"][0]).norm() / (after - before).norm()
        assert err < 1e-2, err.item()


def test_ranks_stay_bitwise_in_sync(gpt_run):
    start = flat(_gpt().parameters())
    for step in range(20):
        assert torch.equal(gpt_run[0]["params"][step], gpt_run[1]["params"][step]), step
    assert not torch.equal(gpt_run[0]["params"][-1], start)
    assert gpt_run[0]["grads_untouched"] and gpt_run[1]["grads_untouched"]  # p.grad stays rank-local


# ---------------------------------------------------------------- a toy parameter set

def _toy_params(seed=0):
    g = torch.Generator().manual_seed(seed)

    def param(*shape):
        return torch.nn.Parameter(torch.randn(*shape, generator=g) * 0.1)

    # 3 tall, 4 wide and 1 square matrix: with W=2 or 3 most groups need padding;
    # emb (2048 elements) is row-sharded when 64 % W == 0 (W=2), all-reduced otherwise (W=3)
    return ([param(12, 8) for _ in range(3)] + [param(8, 16) for _ in range(4)] + [param(6, 6)]
            + [param(64, 32), param(5), param(4, 4)])


FROZEN = 10  # index of the parameter that never has a gradient


def _toy_groups(ps):
    return [dict(kind="muon", params=ps[0:3], lr=0.04, momentum=0.9, beta2=0.95, weight_decay=0.2),
            dict(kind="muon", params=ps[3:7], lr=0.03, weight_decay=0.1),
            dict(kind="muon", params=ps[7:8], lr=0.02),
            dict(kind="adamw", params=ps[8:9], lr=0.01, betas=(0.8, 0.95), eps=1e-10, weight_decay=0.1),
            dict(kind="adamw", params=ps[9:11], lr=0.05)]


def _toy_grad(p, rank, step, i):
    """A dyadic gradient (multiples of 1/16): sums of a few of them are exact in any order."""
    g = torch.Generator().manual_seed((step * 16 + rank) * 64 + i)
    return (torch.randint(-8, 9, p.shape, generator=g).float() / 16).to(p.dtype)  # exact in bf16 too


def _set_rank_grads(ps, rank, step, missing=()):
    for i, p in enumerate(ps):
        p.grad = None if i == FROZEN or i in missing else _toy_grad(p, rank, step, i)


def _set_mean_grads(ps, world, step, missing=None):
    """The average the ranks reduce to: sum over ranks (zeros where a rank has none) / W."""
    missing = missing or {}
    for i, p in enumerate(ps):
        if i == FROZEN:
            p.grad = None
            continue
        total = torch.zeros_like(p)
        for r in range(world):
            if i not in missing.get(r, ()):
                total += _toy_grad(p, r, step, i)
        p.grad = total.div_(world)


def _toy_reference(world, steps, missing=None, opt_cls=MuonAdamW):
    with one_thread():
        ps = _toy_params()
        opt = opt_cls(_toy_groups(ps))
        history = []
        for step in range(steps):
            _set_mean_grads(ps, world, step, missing)
            opt.step()
            history.append(flat(ps))
        return ps, opt, history


def _toy_worker(rank, world, steps, missing):
    ps = _toy_params()
    opt = DistMuonAdamW(_toy_groups(ps))
    history = []
    for step in range(steps):
        _set_rank_grads(ps, rank, step, missing.get(rank, ()))
        opt.step()
        history.append(flat(ps))
    # a muon matrix without a gradient on any rank must raise on every rank, not hang
    _set_rank_grads(ps, rank, steps, missing=(3,))
    try:
        opt.step()
        raised = False
    except RuntimeError:
        raised = True
    dist.barrier()  # the group is still usable afterwards
    return {"history": history, "raised": raised, "full": opt.full_state_dict()}


def test_ownership_partitions_every_stack():
    for n in range(1, 9):
        for world in range(1, 5):
            ranges = [owned_range(n, r, world) for r in range(world)]
            assert [i for a, b in ranges for i in range(a, b)] == list(range(n))
    assert adamw_is_sharded(torch.zeros(64, 32), 2) and not adamw_is_sharded(torch.zeros(64, 32), 3)
    assert not adamw_is_sharded(torch.zeros(8), 2) and not adamw_is_sharded(torch.zeros(64, 32), 1)


@pytest.mark.parametrize("world", [2, 3])
def test_padding_when_world_does_not_divide_the_stack(world, tmp_path):
    steps = 3
    results = run_ranks(_toy_worker, world, tmp_path / "ranks", steps, {})
    _, ref_opt, ref = _toy_reference(world, steps)
    for res in results:
        assert res["raised"]
        for step in range(steps):
            assert torch.equal(res["history"][step], ref[step]), step
        assert_state_equal(res["full"], ref_opt.state_dict())


def test_parameter_without_gradient_on_one_rank(tmp_path):
    """Rank 1 has no gradient for a muon matrix, a row-sharded and a replicated adamw param;
    documented semantics: it contributes zeros, the average is still sum / W. The frozen
    param has no gradient anywhere: not stepped, no state (as in MuonAdamW)."""
    missing = {1: (1, 8, 9)}
    results = run_ranks(_toy_worker, 2, tmp_path / "ranks", 3, missing)
    _, ref_opt, ref = _toy_reference(2, 3, missing)
    for res in results:
        assert res["raised"]
        for step in range(3):
            assert torch.equal(res["history"][step], ref[step]), step
        assert_state_equal(res["full"], ref_opt.state_dict())
        assert FROZEN not in res["full"]["state"]


# ---------------------------------------------------------------- checkpoints

def _continue(ps, opt, rank, world, start, steps):
    history = []
    for step in range(start, start + steps):
        _set_rank_grads(ps, rank, step)
        opt.step()
        history.append(flat(ps))
    return history


def _state_worker(rank, world, k, extra):
    ps = _toy_params()
    opt = DistMuonAdamW(_toy_groups(ps))
    _continue(ps, opt, rank, world, 0, k)
    full, shard, params_k = opt.full_state_dict(), copy.deepcopy(opt.state_dict()), flat(ps)
    out = {"full": full, "shard": shard, "params_k": params_k,
           "cont": _continue(ps, opt, rank, world, k, extra)}
    for name, load in (("from_shard", lambda o: o.load_state_dict(copy.deepcopy(shard))),
                       ("from_full", lambda o: o.load_full_state_dict(full))):
        ps2 = _toy_params(seed=7)
        unflat(params_k, ps2)
        opt2 = DistMuonAdamW(_toy_groups(ps2))
        load(opt2)
        out[name] = _continue(ps2, opt2, rank, world, k, extra)
    return out


def _resume_worker(rank, world, path, k, extra):
    saved = torch.load(path, weights_only=True)
    ps = _toy_params(seed=7)
    unflat(saved["params"], ps)
    opt = DistMuonAdamW(_toy_groups(ps))
    opt.load_state_dict(saved["optimizer"])  # a full dict: each rank keeps its shard
    return {"cont": _continue(ps, opt, rank, world, k, extra), "full": opt.full_state_dict()}


def _resume_reference(full, params_k, world, k, extra, opt_cls=MuonAdamW):
    with one_thread():
        ps = _toy_params(seed=7)
        unflat(params_k, ps)
        opt = opt_cls(_toy_groups(ps))
        opt.load_state_dict(copy.deepcopy(full))
        history = []
        for step in range(k, k + extra):
            _set_mean_grads(ps, world, step)
            opt.step()
            history.append(flat(ps))
        return opt, history


def test_checkpoints_shard_full_and_resume_with_another_world_size(tmp_path):
    k, extra = 3, 2
    results = run_ranks(_state_worker, 2, tmp_path / "w2", k, extra)
    _, ref_opt, _ = _toy_reference(2, k)
    # the gathered state is MuonAdamW's state after the same k steps, on every rank
    for res in results:
        assert_state_equal(res["full"], ref_opt.state_dict())
    # shard layout: rank-local buffers, tagged with rank and world size
    for rank, res in enumerate(results):
        shard = res["shard"]
        assert shard["distributed"] == {"layout": "rank_shard", "rank": rank, "world_size": 2}
        assert shard["state"][0]["momentum_buffer"].shape == ((2, 1)[rank], 12, 8)  # 3 tall matrices over 2
        assert shard["state"][7]["momentum_buffer"].shape == ((1, 0)[rank], 6, 6)  # 1 matrix: rank 1 owns none
        assert shard["state"][8]["exp_avg"].shape == (32, 32)  # emb rows split in two
        assert shard["state"][9]["exp_avg"].shape == (5,)  # small: replicated
    # resuming from the shard or the full dict continues exactly as the uninterrupted run
    for res in results:
        for step in range(extra):
            assert torch.equal(res["from_shard"][step], res["cont"][step])
            assert torch.equal(res["from_full"][step], res["cont"][step])
    # ... and so does one process loading the full dict (MuonAdamW and DistMuonAdamW alike)
    full, params_k = results[0]["full"], results[0]["params_k"]
    for opt_cls in (MuonAdamW, DistMuonAdamW):
        _, ref = _resume_reference(full, params_k, 2, k, extra, opt_cls)
        for step in range(extra):
            assert torch.equal(ref[step], results[0]["cont"][step]), (opt_cls, step)
    # ... and three ranks loading the 2-rank full dict match one process fed their average
    torch.save({"optimizer": full, "params": params_k}, tmp_path / "ckpt.pt")
    results3 = run_ranks(_resume_worker, 3, tmp_path / "w3", str(tmp_path / "ckpt.pt"), k, extra)
    ref_opt3, ref3 = _resume_reference(full, params_k, 3, k, extra)
    for res in results3:
        for step in range(extra):
            assert torch.equal(res["cont"][step], ref3[step]), step
        assert_state_equal(res["full"], ref_opt3.state_dict())


# ---------------------------------------------------------------- no process group

def test_without_process_group_it_is_muon_adamw():
    assert not dist.is_initialized()
    a, b = _gpt(), _gpt()
    opt_a, opt_b = MuonAdamW(_gpt_groups(a)), DistMuonAdamW(_gpt_groups(b))
    assert opt_b.world() == (0, 1)
    for step in range(3):
        x, y = _global_batch(step)
        for model, opt in ((a, opt_a), (b, opt_b)):
            model(x, y).backward()
            opt.step()
            model.zero_grad(set_to_none=True)
        assert torch.equal(flat(a.parameters()), flat(b.parameters())), step
    sd = opt_b.state_dict()
    assert "distributed" not in sd
    assert_state_equal(sd, opt_a.state_dict())
    assert_state_equal(opt_b.full_state_dict(), opt_a.state_dict())
    fresh = DistMuonAdamW(_gpt_groups(_gpt()))
    fresh.load_state_dict(copy.deepcopy(opt_a.state_dict()))
    assert_state_equal(fresh.state_dict(), opt_a.state_dict())
    with pytest.raises(ValueError, match="full_state_dict"):
        fresh.load_state_dict(dict(sd, distributed={"layout": "rank_shard", "rank": 0, "world_size": 2}))
