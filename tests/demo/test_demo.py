"""`muonlab demo`: its precision choice and the ending that shows what the tool is for (validation BPB
against xz on the same bytes, the run's ledger line, next commands), on a few steps of a small corpus."""

import json

import pytest

import muonlab.demo as demo
from muonlab.cli import build_parser
from muonlab.record.ledger import read_records


@pytest.mark.parametrize("native, expected", [(True, "bf16"), (False, "fp32")])
def test_demo_trains_in_bf16_only_where_the_cpu_multiplies_bf16(monkeypatch, native, expected):
    monkeypatch.setattr(demo, "cpu_has_native_bf16", lambda: native)
    assert demo.demo_precision() == expected


def test_demo_ends_with_curve_ledger_line_and_next_commands(tmp_path):
    small = {"num_steps": 6, "eval_tokens": 2048, "source": "synthetic", "vocab_size": 300, "max_doc_chars": None,
             "log_every": 2, "depth": 2, "aspect_ratio": 32, "head_dim": 32, "sequence_len": 64,
             "device_batch_size": 4, "total_batch_size": 256, "eval_every": 2, "eval_every_tokens": 512}
    report = demo.run_demo(cache_dir=str(tmp_path), quiet=True, overrides=small)
    curve = report["bpb_curve"]
    with open(curve, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    # the picture's line is xz on exactly the bytes the periodic evaluations scored
    from muonlab.config import load_config_file
    from muonlab.data.prepare import compress_bits_per_byte, prepare_data

    (run,) = [r for r in read_records(report["ledger"]) if r["run_id"] == report["ledger_line"]["run_id"]]
    assert [e["step"] for e in run["evals"]] == [2, 4, 6]
    cfg = load_config_file(f"{report['run_dir']}/config.json")
    scored = prepare_data(cfg.data, log=lambda _: None).eval_bytes("val", 64, 512)
    assert report["xz_val_bpb"] == compress_bits_per_byte(scored)
    (record,) = [r for r in read_records(report["ledger"]) if r["run_id"] == report["ledger_line"]["run_id"]]
    assert report["ledger_line"]["val_bpb"] == record["metrics"]["val_bpb"] == report["val_bpb"]
    assert report["ledger_line"]["status"] == "ok" and report["precision"] == demo.demo_precision()
    text = demo.format_demo(report)
    assert curve in text and json.dumps(report["ledger_line"]) in text
    parser = build_parser()
    for _why, command in demo.NEXT_COMMANDS:
        assert command in text
        parser.parse_args(command.split()[1:])  # each suggestion is a valid command line
