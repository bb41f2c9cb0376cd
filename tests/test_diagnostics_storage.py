"""Saved-tensor storage audit (seed 000 §3.1/§4.1, spec-000-003 §2 item 1): the slice-view pinning.

Relations asserted are the paper's (one extra full (B,T,d) storage per value-embedding layer for
unfused_slice, none for weight_fused and unfused_contig beyond one compact (B,T,32) copy per layer,
and its Delta formula); absolute counts are torch-version specific and are not hard-coded.
"""

import contextlib
import io
import json
import warnings

import pytest
import torch

from muonlab.cli import main
from muonlab.diagnostics import storage
from muonlab.model import GPTConfig
from muonlab.model.gpt import has_ve

pytestmark = pytest.mark.slow  # the audit compiles every implementation (~40 s)

IMPLS = ("none", "unfused_slice", "unfused_contig", "weight_fused")
L = 4  # layers 1 and 3 have value embeddings


@pytest.fixture(scope="module")
def result():
    """The audit as `muonlab diagnose storage --json` reports it (its default shapes are these)."""
    out = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(out):
        warnings.simplefilter("ignore")  # torch's own notices from inside the compile stack
        assert main(["diagnose", "storage", "--json"]) == 0
    res = json.loads(out.getvalue())
    assert res["setup"]["n_layer"] == L and set(IMPLS) <= set(res["models"])
    return res


def _n(result, impl, mode, key="full"):
    return result["models"][impl][mode][key]


def test_audit_has_two_value_embedding_layers(result):
    assert result["setup"]["n_ve"] == 2 == sum(has_ve(i, L) for i in range(L))


def test_compiled_shows_one_pinned_full_buffer_per_value_embedding_layer(result):
    n_ve = result["setup"]["n_ve"]
    assert _n(result, "unfused_slice", "compiled") - _n(result, "weight_fused", "compiled") == n_ve
    assert _n(result, "unfused_contig", "compiled") == _n(result, "weight_fused", "compiled")
    assert _n(result, "unfused_contig", "compiled", "gate") == n_ve
    assert _n(result, "weight_fused", "compiled", "gate") == 0
    assert _n(result, "unfused_slice", "compiled", "gate") == 0
    # the paper's baseline = weight-fused storage count (93 vs 93) and no gate-sized storage at B=32
    assert _n(result, "none", "compiled") == _n(result, "weight_fused", "compiled")
    assert _n(result, "none", "compiled", "gate") == 0  # also: no size collision at these shapes
    r = result["models"]["unfused_slice"]["compiled"]
    assert r["full_mb"] == pytest.approx(r["full"] * r["bytes_full"] / 2 ** 20)
    assert r["bytes_full"] == 2 * 48 * 128 * 4 and r["bytes_gate"] == 2 * 48 * 32 * 4


def test_hooks_see_exactly_what_the_compiled_backward_receives(result):
    for impl in IMPLS:
        r = result["models"][impl]["compiled"]
        assert r["bw_matches_hooks"] and r["bw_storages"] == r["storages"]


def test_eager_hides_the_pinning(result):
    """Eager saves the unscaled x_hat for the gain's gradient in every unfused variant."""
    assert _n(result, "unfused_slice", "eager") == _n(result, "unfused_contig", "eager")
    assert _n(result, "unfused_contig", "eager", "gate") == result["setup"]["n_ve"]
    assert _n(result, "unfused_slice", "eager") > _n(result, "weight_fused", "eager")


def test_single_block_has_ve_pins_one_buffer_plain_block_none(result):
    ve, plain = result["blocks"]["has_ve"], result["blocks"]["no_ve"]
    assert ve["unfused_slice"]["full"] - ve["weight_fused"]["full"] == 1
    assert plain["unfused_slice"]["full"] == plain["weight_fused"]["full"]
    assert all(r["bw_matches_hooks"] for b in (ve, plain) for r in b.values())


def test_bf16_autocast_shows_the_paper_pattern():
    """bf16 autocast, n_layer=2 (one value-embedding layer): slice +1 full, gate-scaled +1 gate copy
    (the autocast cast of the fp32 x_hat * gain slice is compact), as in the paper's 97/0 vs 93/4."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        counts = {impl: storage.audit_storage(storage.audit_config(n_layer=2, impl=impl), 2, 48, "compiled",
                                              torch.bfloat16)
                  for impl in ("unfused_slice", "weight_fused", "gate_scaled")}
    assert counts["unfused_slice"]["full"] - counts["weight_fused"]["full"] == 1
    assert counts["gate_scaled"]["full"] == counts["weight_fused"]["full"]
    assert (counts["gate_scaled"]["gate"], counts["weight_fused"]["gate"], counts["unfused_slice"]["gate"]) == (1, 0, 0)
    assert counts["unfused_slice"]["bytes_full"] == 2 * 48 * 128 * 2


def test_predicted_delta_matches_the_paper():
    cfg = lambda L, d: GPTConfig(n_layer=L, n_embd=d, n_head=d // 128, n_kv_head=d // 128, vocab_size=8192)
    assert storage.predicted_slice_delta(cfg(8, 512), 32, 2048) == 256.0  # 4 x 64 MiB
    assert storage.predicted_slice_delta(cfg(8, 512), 64, 2048) == 512.0
    assert storage.predicted_slice_delta(cfg(6, 384), 64, 2048) == 288.0  # depth 6: 3 x 96 MiB
    assert storage.predicted_slice_delta(cfg(8, 512), 32, 2048, itemsize=4) == 512.0


def test_table_lists_every_row(result):
    text = storage.format_storage_table(result)
    for impl in IMPLS:
        for mode in storage.MODES:
            r = result["models"][impl][mode]
            assert any(line.startswith(impl) and mode in line and f"{r['full']} / {r['gate']}" in line
                       for line in text.splitlines())
    assert "256.000 MiB" in text and "single block (has_ve" in text


def test_rejects_unknown_mode_and_dtype():
    cfg = storage.audit_config()
    with pytest.raises(ValueError):
        storage.audit_storage(cfg, 2, 48, mode="inductor")
    with pytest.raises(ValueError):
        storage.audit_storage(cfg, 2, 48, dtype=torch.float16)
