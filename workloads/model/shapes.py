"""Random-weight Qwen2 models of named shapes, written as model folders any command can load.

The validator's limits depend on the model (issue 43): honest bf16 noise grows with depth and width,
so a pool needs a calibration record per model. These shapes are what the benches and the shipped
records measure on a machine with no model hub: the tiny model's width and depth, two in between,
and one with the width and depth of a ~0.5B model (Qwen2-0.5B: hidden 896, 24 layers, MLP 4,864,
14 heads, 2 KV heads), all with the shipped tokenizer (99 tokens, so the embedding stays small).

Weights come from `torch.manual_seed(seed)` and the pinned torch: the same shape and seed make the
same `model.safetensors`, hence the same content address (workloads/inference/judge/calibration.py), on
any machine
with the repository's pinned packages.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from workloads.model.loading import TINY_MODEL_DIR

# name: (hidden, layers, MLP width, attention heads, KV heads)
SHAPES: dict[str, tuple[int, int, int, int, int]] = {
    "tiny-long": (128, 4, 384, 4, 2),
    "small": (512, 8, 1408, 8, 2),
    "medium": (1024, 12, 2816, 16, 4),
    "qwen-0.5b": (896, 24, 4864, 14, 2),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def shape_config(shape: str, vocab_size: int = 99, max_positions: int = 2048) -> Qwen2Config:
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}: one of {', '.join(SHAPES)}")
    hidden, layers, mlp, heads, kv_heads = SHAPES[shape]
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=mlp,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=1,
        pad_token_id=0,
    )


def random_model(shape: str, seed: int = 0) -> Qwen2ForCausalLM:
    """A seeded random-weight model of `shape`, bf16, eval mode."""
    config = shape_config(shape)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    torch.nn.Module.to(model, torch.bfloat16)  # in place; transformers' wrapped `to` confuses mypy
    return model.eval()


def build_model_dir(shape: str, folder: Path, seed: int = 0) -> Path:
    """`folder/<shape>-seed<seed>/`: config, weights and the shipped tokenizer, written once (a folder
    that holds weights already is reused: building the 0.5B shape takes a while on a CPU)."""
    target = folder / f"{shape}-seed{seed}"
    if (target / "model.safetensors").is_file() and (target / "config.json").is_file():
        return target
    target.mkdir(parents=True, exist_ok=True)
    random_model(shape, seed).save_pretrained(target)
    for name in TOKENIZER_FILES:
        shutil.copyfile(TINY_MODEL_DIR / name, target / name)
    return target
