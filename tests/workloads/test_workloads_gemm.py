"""bf16 linear layers through fp32 GEMM (workloads/model/gemm.py): same sums, the calling thread only."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn
from torch.nn import functional

from workloads.model import gemm


@pytest.fixture
def no_native_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    """Behave as on an AVX2-only CPU whatever this machine is."""
    monkeypatch.setattr(gemm, "native_bf16", lambda: False)


def _model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(384, 128), nn.SiLU(), nn.Linear(128, 96, bias=False))
    return model.to(torch.bfloat16).eval()


@torch.inference_mode()
def test_the_fp32_path_computes_the_same_bf16_sums(no_native_bf16: None) -> None:
    layer = _model()[0]
    x = torch.randn(2048, 384).to(torch.bfloat16)
    native = layer(x)
    with gemm.fp32_gemm(layer):
        routed = layer(x)
    assert routed.dtype == torch.bfloat16 and routed.shape == native.shape
    # Only the order of the fp32 additions differs: rare outputs, each within one bf16 rounding of the
    # value plus fp32's own error on the sum of |products| (a sum that nearly cancels is tiny, and
    # two orders may round it differently).
    differs = (routed != native).float().mean().item()
    assert differs < 0.01, differs
    magnitude = functional.linear(x.float().abs(), layer.weight.float().abs(), layer.bias.float().abs())
    bound = native.float().abs() * 2**-7 + magnitude * 2**-20  # one bf16 ulp is at most 2^-7 of a value
    assert bool(((routed.float() - native.float()).abs() <= bound).all())


@torch.inference_mode()
def test_only_the_calling_thread_inside_the_block_takes_the_fp32_path(
    no_native_bf16: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _model()
    seen: list[torch.dtype] = []
    real = functional.linear

    def spy(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        seen.append(w.dtype)
        return real(x, w, b)

    monkeypatch.setattr(gemm.functional, "linear", spy)
    x = torch.randn(4, 384).to(torch.bfloat16)
    inside = threading.Event()
    leave = threading.Event()
    other: list[torch.dtype] = []

    def in_block() -> None:
        with gemm.fp32_gemm(model):
            model(x)
            inside.set()
            leave.wait(10)

    worker = threading.Thread(target=in_block)
    worker.start()
    assert inside.wait(10)
    assert seen == [torch.float32, torch.float32]
    seen.clear()
    model(x)  # this thread, while the other one is inside its block
    other.extend(seen)
    leave.set()
    worker.join(10)
    assert other == [torch.bfloat16, torch.bfloat16]
    seen.clear()
    model(x)  # after the block: PyTorch's own kernel again
    assert seen == [torch.bfloat16, torch.bfloat16]


@torch.inference_mode()
def test_weights_loaded_in_place_are_the_ones_used(no_native_bf16: None) -> None:
    model = _model()
    x = torch.randn(8, 384).to(torch.bfloat16)
    with gemm.fp32_gemm(model):
        before = model(x)
    model.load_state_dict(_model(seed=1).state_dict())  # a new checkpoint into the same modules
    with gemm.fp32_gemm(model):
        after = model(x)
    assert not torch.equal(before, after)
    assert (after != model(x)).float().mean().item() < 0.01  # the new weights, as PyTorch's kernel sees them


@torch.inference_mode()
def test_nothing_changes_where_bf16_is_native_or_the_model_is_not_bf16(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gemm, "native_bf16", lambda: True)
    model = _model()
    x = torch.randn(8, 384).to(torch.bfloat16)
    with gemm.fp32_gemm(model):
        assert torch.equal(model(x), model[2](model[1](functional.linear(x, model[0].weight, model[0].bias))))
    assert not hasattr(model, gemm._INSTALLED)
    monkeypatch.setattr(gemm, "native_bf16", lambda: False)
    fp32 = _model().float()
    with gemm.fp32_gemm(fp32):
        fp32(x.float())
    assert not hasattr(fp32, gemm._INSTALLED)
