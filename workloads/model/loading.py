"""Loading models and tokenizers: the shipped tiny model by default, any Hugging Face causal LM by
name or path (on GPU hosts; nothing can be downloaded from a model hub on CI machines)."""

from __future__ import annotations

import hashlib
import json
import threading
from functools import lru_cache
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from intellect.device import ATTENTION, resolve_device
from intellect.workloads import CheckpointSource

TINY_MODEL_DIR = Path(__file__).resolve().parent / "tiny"
TINY = "tiny"
_GENERIC_CLASSES = {"TokenizersBackend", "PreTrainedTokenizerFast"}  # alias accepted wherever a model name is


def resolve(name_or_path: str | Path | None) -> str:
    if name_or_path in (None, "", TINY):
        return str(TINY_MODEL_DIR)
    return str(name_or_path)


_LOAD_LOCK = threading.Lock()


def load_model(
    name_or_path: str | Path | None = None,
    *,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
) -> PreTrainedModel:
    """Load a causal LM in `dtype` (bf16 like a real deployment; torch runs bf16 on CPU), eval mode,
    on `device`: a torch device or a device setting (`auto`, `cpu`, `cuda`, `cuda:N`; see
    `intellect.device`, which refuses CUDA where there is none). Attention is PyTorch's SDPA
    (flash / memory-efficient kernels on a GPU; what transformers picks on a CPU anyway).

    A hub name works where the hub is reachable (GPU hosts); `None` or "tiny" is the shipped model."""
    target = resolve_device(device)
    # transformers builds the model on the meta device and then fills it: two threads doing that at
    # once (two validator services in one process) can see each other's meta tensors. One at a time.
    with _LOAD_LOCK:
        model = AutoModelForCausalLM.from_pretrained(
            resolve(name_or_path), dtype=dtype, attn_implementation=ATTENTION
        )
        # transformers wraps `to` in `functools.wraps(nn.Module.to)`, whose stub types the unbound
        # method: mypy takes `device` for `self`. The call itself is the ordinary `Module.to`.
        return model.to(target).eval()  # type: ignore[arg-type]


@lru_cache(maxsize=16)
def base_checkpoint_sha256(name_or_path: str | Path | None = None) -> str | None:
    """sha256 of a local model's weights file (`model.safetensors`): the identity of "step 0".
    None for a hub name or a sharded model, whose weights are not one local file."""
    weights = Path(resolve(name_or_path)) / "model.safetensors"
    if not weights.is_file():
        return None
    digest = hashlib.sha256()
    with open(weights, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_tokenizer(name_or_path: str | Path | None = None) -> PreTrainedTokenizerBase:
    source = resolve(name_or_path)
    config = Path(source) / "tokenizer_config.json"
    generic = config.exists() and json.loads(config.read_text()).get("tokenizer_class") in _GENERIC_CLASSES
    # AutoTokenizer would pick the architecture's tokenizer class (Qwen2's adds a byte-level
    # pre-tokenizer that eats spaces); a plain tokenizer.json must be loaded as it is.
    tok = (PreTrainedTokenizerFast if generic else AutoTokenizer).from_pretrained(source)
    tok.padding_side = "left"  # batched decoding pads on the left
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_weights(model: PreTrainedModel, safetensors_path: str | Path) -> PreTrainedModel:
    """Replace the model's weights by a checkpoint's (a trainer step), keeping the model's dtype."""
    state = load_file(str(safetensors_path))
    dtype = next(model.parameters()).dtype
    missing, unexpected = model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=False)
    # Tied embeddings legitimately omit lm_head.weight; anything else missing is a wrong checkpoint.
    missing = [k for k in missing if not (k == "lm_head.weight" and model.config.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {safetensors_path} does not fit the model: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    return model.eval()


class ModelCheckpoints:
    """A task's checkpoints by step for its judge: the host's (`intellect.workloads.CheckpointSource`:
    the trainer's published files, or files given on `intellect-validator check`'s command line), and
    step 0 as the task's base model where the host has no file for it (only the workload knows which
    model a task names). The base model's sha256 is computed once."""

    def __init__(self, model: str = "tiny", host: CheckpointSource | None = None) -> None:
        self.model = model
        self.host = host
        self._base: tuple[Path, str] | None = None

    def checkpoint_for(self, step: int) -> tuple[Path, str] | None:
        found = self.host.checkpoint_for(step) if self.host is not None else None
        if found is not None or step != 0:
            return found
        if self._base is None:
            sha = base_checkpoint_sha256(self.model)
            if sha is None:
                return None
            self._base = (Path(resolve(self.model)) / "model.safetensors", sha)
        return self._base
