"""Shared fixtures: the shipped tiny model (bf16, CPU), its tokenizer and a torch backend."""

from __future__ import annotations

import pytest
import torch

from workloads.model.backends import TorchBackend
from workloads.model.loading import load_model, load_tokenizer

torch.set_num_threads(1)  # tiny model: threads only add contention on 2-core CI machines


@pytest.fixture(scope="session")
def tiny_model():
    return load_model("tiny")


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return load_tokenizer("tiny")


@pytest.fixture(scope="session")
def backend(tiny_model, tiny_tokenizer):
    return TorchBackend(tiny_model, tiny_tokenizer.eos_token_id, tiny_tokenizer.pad_token_id)


@pytest.fixture(scope="session")
def prompts(tiny_tokenizer):
    texts = ["12+34=", "rev abcdef=", "sort 93412=", "7+5=", "rev xyz=", "sort 8080="]
    return [tiny_tokenizer(t)["input_ids"] for t in texts]
