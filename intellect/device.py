"""Where a model runs and in which precision: the one rule the worker's inference, the trainer and the
validator's recomputation share.

The device setting (`INTELLECT_INFER_DEVICE`, `INTELLECT_TRAIN_DEVICE`, `INTELLECT_VALIDATOR_DEVICE`
and their `--device` flags) takes `auto`, `cpu`, `cuda` or `cuda:N`. `auto` is the first CUDA device
when PyTorch sees one, else the CPU, so a GPU host uses its GPU without being told and a CPU host
behaves exactly as before the setting existed. Asking for CUDA where there is none, or for a device
index the host does not have, is refused at start with the setting named: running on the CPU instead
would be a silent 100x slowdown on a machine the operator believes is a GPU host.

Precision, by device:

- inference and the validator's recomputation: bf16 weights on every device. On CUDA the linear
  layers run in bf16 on tensor cores; on a CPU in bf16 too, except the validator's prefill on a CPU
  without bf16 arithmetic, which goes through fp32 GEMM (`workloads/model/gemm.py`: same sums).
- the trainer: fp32 master weights on every device; on CUDA its forward passes run under bf16
  autocast, on the CPU in fp32 (as before the device setting existed).
- attention: PyTorch's SDPA everywhere (flash / memory-efficient kernels on CUDA); decoding keeps a
  KV cache and prefills each batch's prompts in one pass (`workloads/model/backends.py`).

Workers and validators must agree on the weights' dtype (TOPLOC and the logprob checks compare bf16
results), so it is bf16 on every device. The trainer keeps fp32 master weights everywhere: its
learning rates (3e-7) are far below bf16's resolution (2^-8 relative), so updates applied to bf16
weights would round away; on CUDA its matrix products run in bf16 under autocast, as GPU training does.

This module imports torch only inside its functions: the settings that validate a device string are
also imported by the orchestrator, which checks task settings and never loads a model.
"""

from __future__ import annotations

import contextlib
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DEVICE_SETTINGS = "auto, cpu, cuda or cuda:N"
DEVICE_DESCRIPTION = f"where models run: {DEVICE_SETTINGS} (auto: the first GPU PyTorch sees, else the CPU)"
_FORM = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


class DeviceSettingError(ValueError):
    """A device setting that is malformed or names a device this host does not have."""


def check_device_setting(value: str) -> str:
    """The setting, normalised (lower case, no spaces), or `DeviceSettingError` naming the forms.

    Syntax only: whether the device exists is `resolve_device`'s business, at start, on the host
    that runs the model (a task's settings are checked by an orchestrator that may have no GPU)."""
    text = str(value).strip().lower()
    if not _FORM.match(text):
        raise DeviceSettingError(f"device {value!r} is not one of {DEVICE_SETTINGS}")
    return text


def resolve_device(setting: str | torch.device | None = "auto") -> torch.device:
    """The torch device a setting names on this host (`None` is `auto`).

    Raises `DeviceSettingError` for a malformed setting, for `cuda` where PyTorch sees no GPU (a CPU
    build of torch, no driver, `CUDA_VISIBLE_DEVICES` empty) and for `cuda:N` beyond the GPUs seen."""
    import torch  # noqa: PLC0415 - see the module docstring

    if isinstance(setting, torch.device):
        setting = str(setting)
    text = check_device_setting("auto" if setting is None else setting)
    if text == "cpu":
        return torch.device("cpu")
    available = torch.cuda.is_available()
    if text == "auto":
        return torch.device("cuda", 0) if available else torch.device("cpu")
    if not available:
        raise DeviceSettingError(
            f"device {text!r} asked for, but PyTorch sees no CUDA GPU here (torch {torch.__version__}, "
            f"built for CUDA {torch.version.cuda or 'none'}): set the device to auto or cpu, or install "
            "a CUDA build of torch and the NVIDIA driver"
        )
    index = int(text.partition(":")[2] or 0)
    count = torch.cuda.device_count()
    if index >= count:
        raise DeviceSettingError(f"device {text!r} asked for, but this host has {count} CUDA device(s) "
                                 f"(cuda:0..cuda:{count - 1}): pick one of them or auto")  # fmt: skip
    return torch.device("cuda", index)


def model_dtype(device: torch.device) -> torch.dtype:
    """Weights (and so hidden states, logits, proofs) of inference and validation: bf16 everywhere,
    as the reference deploys; a worker and a validator on different devices compare the same dtype."""
    import torch  # noqa: PLC0415

    del device  # the same on every device, by design (see the module docstring)
    return torch.bfloat16


ATTENTION = "sdpa"  # PyTorch's scaled_dot_product_attention: flash / memory-efficient kernels on CUDA


def train_autocast(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """The trainer's forward passes: bf16 autocast on CUDA (fp32 master weights, bf16 products); on
    the CPU nothing (fp32 throughout, as before the device setting existed)."""
    import torch  # noqa: PLC0415

    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (timings of asynchronous CUDA kernels); a no-op on the CPU."""
    import torch  # noqa: PLC0415

    if device.type == "cuda":
        torch.cuda.synchronize(device)
