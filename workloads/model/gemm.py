"""bf16 linear layers through fp32 GEMM, for the validator's prefill on CPUs without bf16 arithmetic.

A bf16 linear layer multiplies bf16 inputs by bf16 weights, adds the products up in fp32 and rounds
each sum to bf16 once. CPUs with AVX-512-BF16 or AMX do that in hardware. On the others (AVX2 only)
PyTorch falls back to a generic kernel, about 8 GFLOP/s on this project's 2-core AVX2 host against
74 GFLOP/s for the same product in fp32, which makes a validator's batched prefill (compute-bound) as
slow as a worker's decoding (overhead-bound) and the validator keep up with ~3 workers instead of 25.

The product of two bf16 numbers is exact in fp32 (8 + 8 significant bits fit in 24), so upcasting
both operands, multiplying in fp32 and rounding the result to bf16 computes the same sums; only the
order of the fp32 additions may differ, as it does between any two kernels (a GPU and a CPU, one
library version and the next): on random 4,800 x 384 inputs 1e-4 of the outputs differ, by one bf16
ulp. The TOPLOC, logprob and sampling thresholds are calibrated with this path on
(`bench/validator_calibration.py`, numbers in docs/validator.md).

Scope: `fp32_gemm(model)` turns it on for the calling thread only, around a prefill; generation on
the same model (a worker's decoding, which is not compute-bound) keeps PyTorch's own kernel. The
weights are upcast at each call, never cached: a checkpoint loaded in place is always the one used.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional

_local = threading.local()
_INSTALLED = "_intellect_fp32_gemm"


@functools.cache
def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX-512-BF16 or AMX): then PyTorch's kernel is fast."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return torch.backends.cpu.get_cpu_capability() != "AVX2"
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _forward(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if getattr(_local, "on", False) and x.dtype == torch.bfloat16:
        bias = None if module.bias is None else module.bias.float()
        return functional.linear(x.float(), module.weight.float(), bias).to(torch.bfloat16)
    return functional.linear(x, module.weight, module.bias)


def _install(model: nn.Module) -> None:
    if getattr(model, _INSTALLED, False):
        return
    for module in model.modules():
        if isinstance(module, nn.Linear):
            # an instance attribute shadows nn.Linear.forward; the class and other models are untouched
            setattr(module, "forward", functools.partial(_forward, module))  # noqa: B010
    setattr(model, _INSTALLED, True)


@contextlib.contextmanager
def fp32_gemm(model: nn.Module) -> Iterator[None]:
    """For the calling thread, inside the block: the model's bf16 linear layers compute through fp32
    GEMM when it sits on a CPU without bf16 arithmetic; anywhere else nothing changes."""
    param = next(model.parameters(), None)
    if param is None or param.dtype != torch.bfloat16 or not prefill_in_fp32(param.device):
        yield
        return
    _install(model)
    before = getattr(_local, "on", False)
    _local.on = True
    try:
        yield
    finally:
        _local.on = before


def prefill_in_fp32(device: torch.device) -> bool:
    """Whether the validator's prefill runs bf16 linear layers through fp32 GEMM: on a CPU without
    bf16 arithmetic only (`workloads/model/gemm.py`: the same sums, several times faster there). A GPU
    has bf16 tensor cores: its own kernel is the fast one."""
    return device.type == "cpu" and not native_bf16()
