"""`--tokenizer-json` acts wherever it is accepted (issue 31 item 1): every family that reads local text
trains on the Hugging Face tokenizer's vocabulary (its table has the tokenizer's rows), and the one that
cannot (the autoresearch GPT, which needs its own BPE's token bytes) refuses it in one line."""

from __future__ import annotations

import json

import pytest

from muonlab.cli import main
from muonlab.record.weights import load_safetensors

tokenizers = pytest.importorskip("tokenizers", reason="--tokenizer-json needs the tokenizers library")

CPU_PRESETS = {"tied": "tied-cpu", "hf": "hf-cpu", "t5": "t5-cpu", "reuse": "reuse-cpu"}


@pytest.fixture(scope="module")
def text_and_tokenizer(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    words = [f"w{i}" for i in range(150)]
    lines = [" ".join(words[(7 * i + j) % 150] for j in range(40)) for i in range(400)]
    (root / "corpus.txt").write_text("\n\n".join(lines) + "\n")  # a paragraph a document
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(["[UNK]", *words])},
                                                           unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(root / "tok.json"))
    return root / "corpus.txt", root / "tok.json", 151


@pytest.mark.parametrize("family", sorted(CPU_PRESETS))
def test_every_family_reading_local_text_trains_on_the_tokenizer_it_is_given(family, text_and_tokenizer, tmp_path,
                                                                            capsys):
    corpus, tok, vocab = text_and_tokenizer
    assert main(["train", "--preset", CPU_PRESETS[family], "--source", "local", "--path", str(corpus),
                 "--local-txt-docs", "paragraph", "--tokenizer-json", str(tok), "--num-steps", "2",
                 "--runs-dir", str(tmp_path), "--json"]) == 0
    run_dir = json.loads(capsys.readouterr().out)["run_dir"]
    _, metadata = load_safetensors(f"{run_dir}/model.safetensors")
    assert int(metadata["vocab_size"]) == vocab, family
    config = json.loads(open(f"{run_dir}/config.json").read())["config"]
    assert config["data"]["tokenizer_json"] == str(tok)


def test_the_autoresearch_gpt_refuses_a_tokenizer_it_would_not_read(text_and_tokenizer, tmp_path, capsys):
    corpus, tok, _ = text_and_tokenizer
    assert main(["train", "--preset", "cpu-tiny", "--source", "local", "--path", str(corpus),
                 "--tokenizer-json", str(tok), "--runs-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --tokenizer-json does not act on model family autoresearch") and "\n" not in err
    assert not (tmp_path / "ledger.jsonl").exists()
