"""The shipped model and tokenizer, the training script, weight loading."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from workloads.model.loading import TINY_MODEL_DIR, load_model, load_tokenizer, load_weights

REPO = Path(__file__).resolve().parents[2]


def test_shipped_files_are_small_bf16_safetensors(tiny_model):
    files = {p.name for p in TINY_MODEL_DIR.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= files
    assert (TINY_MODEL_DIR / "model.safetensors").stat().st_size < 4 * 2**20
    assert next(tiny_model.parameters()).dtype == torch.bfloat16
    assert tiny_model.config.model_type == "qwen2"


def test_tokenizer_round_trips_text_with_spaces(tiny_tokenizer):
    text = "rev abc=cba\n\\boxed{x} def f(): return 1"
    ids = tiny_tokenizer(text)["input_ids"]
    assert len(ids) == len(text)  # one token per character, spaces included
    assert tiny_tokenizer.decode(ids) == text
    assert tiny_tokenizer.eos_token == "<eos>" and tiny_tokenizer.pad_token == "<pad>"


def test_rewards_are_mixed(backend, tiny_tokenizer):
    from workloads.datasets import load_dataset
    from workloads.verifiers import score

    records = load_dataset("demo")[:48]
    comps = backend.generate(
        [tiny_tokenizer(r.prompt)["input_ids"] for r in records],
        list(range(48)),
        max_new_tokens=10,
        temperature=1.0,
    )
    rewards = [
        score(r, tiny_tokenizer.decode(c.tokens, skip_special_tokens=True))
        for r, c in zip(records, comps, strict=True)
    ]
    assert 0.1 < sum(rewards) / len(rewards) < 0.9


def test_load_weights_rejects_a_foreign_checkpoint(tmp_path, tiny_model):
    bad = tmp_path / "bad.safetensors"
    save_file({"something.else": torch.zeros(2)}, str(bad))
    model = load_model("tiny")
    with pytest.raises(ValueError, match="does not fit"):
        load_weights(model, bad)


@pytest.mark.slow  # starts other interpreters (see tests/conftest.py)
def test_training_script_runs_and_saves_a_loadable_model(tmp_path):
    out = tmp_path / "m"
    run = subprocess.run(
        [sys.executable, "-m", "workloads.model.train", "--steps", "2", "--batch", "4", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    model, tok = load_model(out), load_tokenizer(out)
    assert model.config.hidden_size == 128 and len(tok) == model.config.vocab_size
