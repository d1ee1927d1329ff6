"""Train the shipped tiny model: `python -m workloads.model.train [--steps N] [--out DIR]`.

Seeded and CPU-only: a 4-layer Qwen2 (hidden 128, about 0.8 M weights) learns the synthetic demo
tasks well enough that sampled rewards are mixed (neither all 0 nor all 1), which is what GRPO
needs. Weights are saved as bf16 safetensors next to config.json and tokenizer.json.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
import typer
from rich.console import Console
from transformers import Qwen2Config, Qwen2ForCausalLM

from workloads.datasets.synthetic import make_task
from workloads.model.loading import TINY_MODEL_DIR
from workloads.model.tokenizer import build_tokenizer
from workloads.verifiers.records import SYNTHETIC_TYPES

console = Console()


def tiny_config(vocab_size: int, eos_id: int, pad_id: int) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=eos_id,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )


def make_batch(rng: np.random.Generator, tok, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded prompt+answer+EOS sequences; labels only on the answer (and EOS)."""
    rows, label_rows = [], []
    for t in rng.choice(list(SYNTHETIC_TYPES), size):
        task = make_task(str(t), rng, "train")
        p = tok(task.prompt)["input_ids"]
        a = tok(task.verification_info["answer"])["input_ids"] + [tok.eos_token_id]
        rows.append(p + a)
        label_rows.append([-100] * len(p) + a)
    width = max(map(len, rows))
    ids = torch.full((size, width), tok.pad_token_id)
    labels = torch.full((size, width), -100)
    for i, (r, lab) in enumerate(zip(rows, label_rows, strict=True)):
        ids[i, : len(r)] = torch.tensor(r)
        labels[i, : len(lab)] = torch.tensor(lab)
    return ids, labels


def main(
    steps: int = typer.Option(300, help="optimizer steps (more makes rewards nearly all 1)"),
    batch: int = typer.Option(128, help="sequences per step"),
    lr: float = typer.Option(3e-3, help="peak learning rate"),
    seed: int = typer.Option(0, help="seed for data and initialisation"),
    out: Path = typer.Option(TINY_MODEL_DIR, help="output directory"),
) -> None:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    tok = build_tokenizer()
    model = Qwen2ForCausalLM(tiny_config(len(tok), tok.eos_token_id, tok.pad_token_id))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    start = time.monotonic()
    model.train()
    for step in range(1, steps + 1):
        ids, labels = make_batch(rng, tok, batch)
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == steps:
            console.print(f"step {step}/{steps} loss {loss.item():.3f} ({time.monotonic() - start:.0f} s)")
    out.mkdir(parents=True, exist_ok=True)
    # `to` is `functools.wraps(nn.Module.to)` in transformers, typed as the unbound method (see loading).
    model.to(torch.bfloat16).save_pretrained(str(out))  # type: ignore[arg-type]
    tok.save_pretrained(str(out))
    console.print(f"saved to {out} ({sum(p.numel() for p in model.parameters())} weights)")


if __name__ == "__main__":
    typer.run(main)
