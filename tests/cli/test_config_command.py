"""`muonlab config`: the resolved config of a preset, arm and flags, each value with the layer it
came from, its hash and protocol id, as TOML a person reads (and tomllib parses) or as JSON."""

from __future__ import annotations

import json
import tomllib

from muonlab.arms import resolve_config
from muonlab.cli import main
from muonlab.settings import flatten


def test_the_toml_holds_the_resolved_values_and_the_layer_of_each(capsys):
    argv = ["config", "--preset", "cpu-tiny", "--arm", "exp17_pair_tied_stopexp", "--num-steps", "5"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    cfg = resolve_config("exp17_pair_tied_stopexp", "cpu-tiny", {"num_steps": 5})
    parsed = flatten(tomllib.loads(text))
    saved = {k: ("none" if v is None else v) for k, v in flatten(cfg.to_dict()).items()
             if k not in ("format", "protocol", "layers")}
    assert parsed == saved
    notes = {line.split(" = ")[0].strip(): line.rsplit("# ", 1)[1] for line in text.splitlines() if " = " in line}
    assert notes["depth"] == "preset" and notes["impl"] == "arm" and notes["num_steps"] == "command line"
    assert notes["window_pattern"] == "default"
    assert notes["tau"].endswith("does not act: the method is off")  # optim.prepolar.tau, prepolar off
    assert f"config_hash {cfg.config_hash()}, protocol {cfg.protocol_id()}" in text


def test_json_gives_the_hash_protocol_origins_and_what_does_not_act(capsys):
    assert main(["config", "--preset", "cpu-tiny", "--prepolar", "hbieq", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    cfg = resolve_config("baseline", "cpu-tiny", {"prepolar": "hbieq"})
    assert out["config_hash"] == cfg.config_hash() and out["protocol"] == cfg.protocol_id()
    assert out["origins"]["optim.prepolar.kind"] == "command line" and out["origins"]["model.depth"] == "preset"
    assert "optim.prepolar.tau" not in out["inactive"] and "optim.whiten.tau" in out["inactive"]
    assert out["config"] == json.loads(json.dumps(cfg.to_dict()))
