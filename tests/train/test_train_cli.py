"""End to end: `muonlab train` on the tiny preset, run directory, ledger, failures, bad input."""

import json
from pathlib import Path

import pytest
import torch

from muonlab.cli import main
from muonlab.record.ledger import read_records

TINY = ["train", "--preset", "cpu-tiny"]


def _ledger(tmp_path) -> list[dict]:
    return list(read_records(Path(tmp_path) / "cache" / "runs" / "ledger.jsonl"))


def test_tiny_run_end_to_end(tmp_path, capsys):
    assert main(TINY + ["--json", "--seed", "7"]) == 0
    out = json.loads(capsys.readouterr().out)
    summary = out["summary"]
    for key in ("val_bpb", "holdout_bpb", "training_seconds", "total_seconds", "peak_vram_mb",
                "mfu_percent", "total_tokens_M", "num_steps", "num_params_M", "depth"):
        assert key in summary
    assert summary["num_steps"] == 12 and summary["depth"] == 2
    assert 0 < summary["val_bpb"] < 10 and 0 < summary["holdout_bpb"] < 10
    # the synthetic source reports its exact entropy rate: no model can beat it
    assert summary["entropy_bpb"] is not None and summary["val_bpb"] > summary["entropy_bpb"] * 0.95
    run_dir = Path(out["run_dir"])
    config = json.loads((run_dir / "config.json").read_text())
    assert config["config"]["seed"] == 7 and len(config["config_hash"]) == 16
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(12))
    assert steps[0]["lrm"] == 1.0 and steps[-1]["lrm"] < 0.5
    state = torch.load(run_dir / "model.pt", weights_only=True)
    assert "transformer.wte.weight" in state
    (record,) = _ledger(tmp_path)
    assert record["status"] == "ok" and record["seed"] == 7 and record["arm"] == "baseline"
    assert record["metrics"]["val_bpb"] == summary["val_bpb"]
    for key in ("holdout_bpb", "val_ce", "val_ppl", "peak_memory_mb", "tokens", "num_params"):
        assert key in record["metrics"]
    prov = record["provenance"]
    for key in ("git_commit", "torch", "python", "corpus_hash", "tokenizer_hash", "device_name"):
        assert key in prov


def test_same_seed_same_result(tmp_path, capsys):
    results = []
    for _ in range(2):
        assert main(TINY + ["--json", "--num-steps", "3"]) == 0
        results.append(json.loads(capsys.readouterr().out)["summary"]["val_bpb"])
    assert results[0] == results[1]


def test_divergence_is_recorded(tmp_path, capsys):
    assert main(TINY + ["--max-loss", "0.5"]) == 1
    err = capsys.readouterr().err
    assert "diverged at step 0" in err
    (record,) = _ledger(tmp_path)
    assert record["status"] == "diverged" and record["metrics"]["diverged_step"] == 0
    summary = json.loads((Path(record["run_dir"]) / "summary.json").read_text())
    assert summary["status"] == "diverged"


def test_a_run_that_fails_mid_training_leaves_the_garbage_collector_on(tmp_path, capsys, monkeypatch):
    """The loop turns Python's GC off after step 0 (upstream's stall fix); a failure at step 1 must not
    leave it off for the rest of the process (a sweep, a notebook, the next test)."""
    import gc

    import muonlab.train.run as run_module

    def boom(*args, **kwargs):
        raise RuntimeError("simulated failure in the step-2 evaluation")

    monkeypatch.setattr(run_module, "evaluate_splits", boom)
    assert gc.isenabled()
    assert main(TINY + ["--eval-every", "2", "--num-steps", "4"]) == 1
    assert "simulated failure" in capsys.readouterr().err
    assert gc.isenabled()


def test_runtime_failure_is_recorded_once(tmp_path, capsys, monkeypatch):
    import muonlab.train.run as run_module

    def boom(*args, **kwargs):
        raise RuntimeError("simulated failure")

    monkeypatch.setattr(run_module, "evaluate_splits", boom)
    monkeypatch.delenv("MUONLAB_DEBUG", raising=False)
    assert main(TINY) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: RuntimeError: simulated failure") and "\n" not in err
    (record,) = _ledger(tmp_path)
    assert record["status"] == "failed" and "simulated failure" in record["error"]
    assert "Traceback" in record["traceback"] and "boom" in record["traceback"]  # kept for the post-mortem
    monkeypatch.setenv("MUONLAB_DEBUG", "1")  # a developer can ask for the traceback itself
    with pytest.raises(RuntimeError, match="simulated failure"):
        main(TINY)


@pytest.mark.parametrize("argv,needle", [
    (["--bogus"], "unknown option --bogus"),
    (["--n-embd", "100"], "not divisible by head_dim"),
    (["--device-batch-size", "3"], "not divisible by device_batch_size"),
    (["--preset", "nope"], "invalid choice"),
    (["--source", "local", "--path", "/nonexistent/corpus"], "/nonexistent/corpus"),
    (["--num-steps", "0"], "num_steps"),
    (["--precision", "fp8"], "precision"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, argv, needle):
    assert main(TINY + argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err and needle in err
    assert _ledger(tmp_path) == []  # bad input is not a run: no ledger line


def test_help_for_every_verb(capsys):
    for verb in ("prepare", "train", "demo", "verify-reference", "doctor"):
        with pytest.raises(SystemExit) as exc:
            main([verb, "--help"])
        assert exc.value.code == 0
        assert verb.split("-")[0] in capsys.readouterr().out.lower()


def test_prepare_json(capsys):
    assert main(["prepare", "--preset", "cpu-tiny", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["corpus_hash"] and payload["tokenizer_hash"]


def test_the_summary_block_shows_the_family_figures_after_upstreams_keys():
    """The keys a family adds between `depth` and `status` (its metric, its final figures) are printed
    after upstream's with 6 decimals; the bookkeeping after `status` is not printed."""
    from muonlab.train.run import SUMMARY_KEYS, format_summary

    summary = {key: 1.0 for key in SUMMARY_KEYS} | {"depth": 2, "val_ce": 4.482425, "tied_rms": 0.0331322,
                                                    "status": "ok", "startup_seconds": 3.5}
    lines = format_summary(summary).splitlines()
    assert lines[0] == "---" and [line.split(":")[0] for line in lines[1:]] == [*SUMMARY_KEYS, "val_ce", "tied_rms"]
    assert lines[-2:] == ["val_ce:           4.482425", "tied_rms:         0.033132"]
