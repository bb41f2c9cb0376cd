"""The tied MoE under torch.compile (seed 004 App. J.6): one static graph whatever the routing
(the eager dispatch's per-expert token counts recompiled every batch), the eager dispatch's numbers,
and experts that no token chose still without a gradient, as eagerly."""

import math

import pytest
import torch

from muonlab.families import get_family
from muonlab.families.tied.moe import TopKMoE
from muonlab.families.tied.model import build_tied_model
from muonlab.families.tied.model import MLP
from muonlab.families.tied.moe import UnroutedExpertGrads

# torch's own compile stack calls its deprecated torch.jit.script_method; nothing here uses TorchScript
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")

D, E = 16, 4


def _moe(top_k: int, seed: int = 0, dtype=torch.float64) -> TopKMoE:
    torch.manual_seed(seed)
    return TopKMoE(D, E, top_k, 0.01, lambda: MLP(D, 48, math.sqrt(2.0))).to(dtype)


def _routing_by_transcription(logits: list[list[float]], top_k: int) -> list[list[tuple[int, float]]]:
    """Per token, (expert, gate) pairs: softmax, top-k, gates renormalised (top-1: exactly 1)."""
    routes = []
    for row in logits:
        z = [math.exp(v - max(row)) for v in row]
        p = [v / sum(z) for v in z]
        chosen = sorted(range(len(p)), key=lambda e: -p[e])[:top_k]
        total = sum(p[e] for e in chosen)
        routes.append([(e, 1.0 if top_k == 1 else p[e] / total) for e in chosen])
    return routes


@pytest.mark.parametrize("top_k", [1, 2])
def test_the_compiled_dispatch_gives_the_eager_numbers(top_k):
    """Both dispatches against a float64 transcription of the routing, token by token, and
    against each other in every gradient."""
    moe = _moe(top_k)
    x = torch.randn(3, 40, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    flat = x.reshape(-1, D)
    routes = _routing_by_transcription((flat @ moe.router.weight.T).tolist(), top_k)
    direct = torch.stack([sum(g * moe.experts[e](flat[t : t + 1])[0] for e, g in route)
                          for t, route in enumerate(routes)])
    results = {}
    for name in ("_dispatch_sparse", "_dispatch_dense"):
        moe.zero_grad(set_to_none=True)
        xi = flat.clone().requires_grad_()
        _, top_idx, gates = moe.route(xi)
        y = getattr(moe, name)(xi, top_idx, gates)
        torch.testing.assert_close(y, direct, rtol=1e-12, atol=1e-12)
        ((y * torch.linspace(-1, 1, D, dtype=y.dtype)).sum() + moe(xi)[1]).backward()
        results[name] = {"x": xi.grad, **{n: p.grad for n, p in moe.named_parameters()}}
    sparse, dense = results["_dispatch_sparse"], results["_dispatch_dense"]
    assert sparse.keys() == dense.keys()
    for name in sparse:
        torch.testing.assert_close(dense[name], sparse[name], rtol=1e-12, atol=1e-12, msg=name)


def _batches(n: int):
    return [torch.randn(2, 30, D, generator=torch.Generator().manual_seed(seed)) for seed in range(n)]


def test_the_layer_compiles_once_for_every_routing():
    moe = _moe(1, dtype=torch.float32)
    from torch._dynamo.testing import CompileCounter  # imported here: collecting stays cheap

    counter = CompileCounter()
    compiled = torch.compile(moe, backend=counter, dynamic=False)
    counts = []
    for x in _batches(3):
        y, aux = compiled(x)
        (y.square().mean() + aux).backward()
        counts.append(moe.last_counts.tolist())
    assert len({tuple(c) for c in counts}) == 3  # three different routings ...
    assert counter.frame_count == 1  # ... one graph (the eager dispatch: a graph per token count)


def test_the_tied_moe_model_compiles_once_and_matches_eager():
    torch.manual_seed(0)
    model = build_tied_model("tied-tiny-moe").train()
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("aot_eager")  # dynamo, then AOT autograd's graphs run eagerly
    compiled = torch.compile(model, backend=counter, dynamic=False)
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        idx, targets = (torch.randint(0, model.config.vocab_size, (2, 64), generator=g) for _ in range(2))
        model.zero_grad(set_to_none=True)
        eager = model(idx, targets)
        eager.backward()
        eager_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        loss = compiled(idx, targets)
        loss.backward()
        torch.testing.assert_close(loss, eager, rtol=1e-5, atol=1e-6)
        for name, grad in eager_grads.items():
            torch.testing.assert_close(dict(model.named_parameters())[name].grad, grad, rtol=1e-4, atol=1e-6,
                                       msg=name)
    assert counter.frame_count == 1


def _router_avoiding(moe: TopKMoE, expert: int) -> None:
    """Positive inputs never choose `expert`; negative inputs always do."""
    with torch.no_grad():
        moe.router.weight.abs_()
        moe.router.weight[expert].neg_()


def _micro_step(moe: TopKMoE, x: torch.Tensor, hook: UnroutedExpertGrads | None) -> None:
    if hook is not None:
        hook.before_micro_step(x)
    y, aux = moe(x)
    (y.sum() + aux).backward()


@pytest.fixture
def compiled_dispatch(monkeypatch):
    """The layer takes its compiled-graph dispatch (chosen by torch.compiler.is_compiling)."""
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)


def test_an_unchosen_expert_keeps_no_gradient_under_the_compiled_dispatch(compiled_dispatch):
    positive = torch.rand(2, 20, D, dtype=torch.float64) + 0.1
    moe = _moe(1)
    _router_avoiding(moe, 3)
    hook = UnroutedExpertGrads([moe])
    _micro_step(moe, positive, hook)
    routed = moe.last_routed.tolist()
    assert routed[3] == 0 and sum(n > 0 for n in routed) >= 2
    assert all(torch.count_nonzero(p.grad) == 0 for p in moe.experts[3].parameters())  # zeros, not None
    hook.before_step(0, optimizer=None)
    for e, n in enumerate(routed):  # as eagerly: None where no token went (AF-Muon skips it), else kept
        assert all((p.grad is None) == (n == 0) for p in moe.experts[e].parameters()), e


def test_an_expert_chosen_in_any_micro_batch_of_the_step_keeps_its_gradient(compiled_dispatch):
    moe = _moe(1)
    _router_avoiding(moe, 3)
    hook = UnroutedExpertGrads([moe])
    without = torch.rand(2, 20, D, dtype=torch.float64) + 0.1  # no token chooses expert 3
    every = -torch.rand(2, 20, D, dtype=torch.float64) - 0.1  # every token chooses expert 3
    for step, micro_batches in enumerate([(without, every), (every, without)]):  # first or last micro-batch
        moe.zero_grad(set_to_none=True)
        for x in micro_batches:
            _micro_step(moe, x, hook)
        hook.before_step(step, optimizer=None)
        assert all(p.grad is not None and torch.count_nonzero(p.grad) > 0 for p in moe.experts[3].parameters())
    moe.zero_grad(set_to_none=True)
    _micro_step(moe, without, hook)  # a step without it: the previous steps' counts do not carry over
    hook.before_step(2, optimizer=None)
    assert all(p.grad is None for p in moe.experts[3].parameters())


def test_eagerly_an_unchosen_expert_has_no_gradient_and_the_hook_changes_nothing():
    moe = _moe(1)
    _router_avoiding(moe, 3)
    hook = UnroutedExpertGrads([moe])
    _micro_step(moe, torch.rand(2, 20, D, dtype=torch.float64) + 0.1, hook)
    grads = {n: p.grad for n, p in moe.named_parameters()}
    assert all(p.grad is None for p in moe.experts[3].parameters())
    hook.before_step(0, optimizer=None)
    assert all(p.grad is grads[n] for n, p in moe.named_parameters())


def test_the_tied_family_hooks_moe_models_only():
    hooks = get_family("tied").step_hooks(None, torch.compile(build_tied_model("tied-tiny-moe")))
    assert len(hooks) == 1 and len(hooks[0].layers) == build_tied_model("tied-tiny-moe").config.n_layer
    assert get_family("tied").step_hooks(None, build_tied_model("tied-tiny")) == []
