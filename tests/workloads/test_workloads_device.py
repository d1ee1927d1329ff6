"""The device setting (`intellect/device.py`): which device `auto`, `cpu`, `cuda` and `cuda:N` name, the
errors for a malformed setting and for CUDA asked where there is none, the dtype rules, and that the
CPU path is unchanged by it: a file made on the explicit `cpu` device is the default path's, byte for
byte. What only a GPU can show (the same noise and verdicts there) is measured by bench/gpu."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from typer.testing import CliRunner

from intellect import device as devices
from intellect.device import DeviceSettingError, check_device_setting, resolve_device
from validator.cli import app as validator_app
from validator.settings import ValidatorSettings
from workloads.datasets import load_dataset
from workloads.inference.generate import make_rollouts
from workloads.inference.judge.checks.tokens import token_checks
from workloads.inference.selection import plan_batch
from workloads.inference.settings import InferenceSettings
from workloads.inference.workload import InferenceWorkload
from workloads.model import gemm, sampler
from workloads.model.prefill import prefill_batch
from workloads.trainer.settings import TrainerSettings

NODE = "0x5aeda56215b167893e80b4fe645ba6d5bab767de"


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host without CUDA, wherever the test runs (also on a GPU host)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def one_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host with one CUDA device, as PyTorch reports it (nothing is allocated there)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


def test_auto_is_the_gpu_where_pytorch_sees_one_else_the_cpu(no_gpu: None, monkeypatch: pytest.MonkeyPatch):
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device(None) == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda", 0)


def test_explicit_devices(one_gpu: None):
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(" CPU ") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    assert resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    with pytest.raises(DeviceSettingError, match=r"1 CUDA device\(s\) \(cuda:0\.\.cuda:0\)"):
        resolve_device("cuda:1")


@pytest.mark.parametrize("asked", ["cuda", "cuda:0", "cuda:2"])
def test_cuda_asked_where_there_is_none_names_the_fix(no_gpu: None, asked: str):
    with pytest.raises(DeviceSettingError, match="sees no CUDA GPU here.*set the device to auto or cpu"):
        resolve_device(asked)


@pytest.mark.parametrize("bad", ["gpu", "cuda:", "cuda:x", "cuda0", "", "mps", "cpu:0"])
def test_malformed_settings_are_refused_with_the_forms(bad: str):
    with pytest.raises(DeviceSettingError, match="is not one of auto, cpu, cuda or cuda:N"):
        check_device_setting(bad)
    with pytest.raises(DeviceSettingError):
        resolve_device(bad)


def test_every_settings_model_takes_the_device_from_env_and_refuses_a_bad_one(
    monkeypatch: pytest.MonkeyPatch,
):
    for model, env, default in ((InferenceSettings, "INTELLECT_INFER_DEVICE", "auto"),
                                (TrainerSettings, "INTELLECT_TRAIN_DEVICE", "auto"),
                                (ValidatorSettings, "INTELLECT_VALIDATOR_DEVICE", "cpu")):  # fmt: skip
        assert model().device == default  # the judge stays where its thresholds were calibrated
        monkeypatch.setenv(env, "CUDA:1")
        assert model().device == "cuda:1"  # syntax only: the host's GPUs are resolve_device's business
        monkeypatch.setenv(env, "gpu")
        with pytest.raises(ValidationError, match="auto, cpu, cuda or cuda:N"):
            model()
        monkeypatch.delenv(env)


def test_dtype_rules(monkeypatch: pytest.MonkeyPatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert devices.model_dtype(cpu) == devices.model_dtype(cuda) == torch.bfloat16
    assert devices.ATTENTION == "sdpa"
    monkeypatch.setattr(gemm, "native_bf16", lambda: False)
    assert gemm.prefill_in_fp32(cpu) and not gemm.prefill_in_fp32(cuda)
    monkeypatch.setattr(gemm, "native_bf16", lambda: True)
    assert not gemm.prefill_in_fp32(cpu) and not gemm.prefill_in_fp32(cuda)
    with devices.train_autocast(cpu):  # the CPU trainer stays in fp32
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    with warnings.catch_warnings():  # a CPU-only torch warns that CUDA autocast would be disabled
        warnings.simplefilter("ignore")
        autocast = devices.train_autocast(cuda)
    assert isinstance(autocast, torch.autocast) and autocast.fast_dtype == torch.bfloat16


def test_the_gpu_noise_is_the_cpu_noise_bit_for_bit():
    """The hash as torch computes it on a GPU, run here on the CPU: the same float32 noise as numpy's,
    at a real vocabulary size, for extreme seeds and positions too."""
    rng = np.random.default_rng(5)
    seeds = [0, 1, 2**63 - 2, *rng.integers(0, 2**63 - 1, 5).tolist()]
    positions = [0, 2**20, 7, *rng.integers(0, 4096, 5).tolist()]
    numpy_noise = sampler.noise_matrix(seeds, positions, 151_936)
    torch_noise = sampler._noise_on_device(seeds, positions, 151_936, torch.device("cpu"))
    assert torch_noise.dtype == torch.float32 and torch.equal(numpy_noise, torch_noise)


def test_token_checks_in_slices_equal_the_whole(tiny_model, tiny_tokenizer, backend):
    """A GPU validator checks a big vocabulary's tokens a slice at a time: exactly the same numbers."""
    records = load_dataset("demo")
    plan = plan_batch(NODE, 1, len(records), 3, 2, [8])
    rows, _ = make_rollouts(backend, tiny_tokenizer, records, plan, step=0, max_new_tokens=12,
                            temperature=1.0, length_penalty=3e-4)  # fmt: skip
    recomputed = prefill_batch(tiny_model, [r.input_tokens for r in rows], [r.output_tokens for r in rows])
    whole = token_checks(rows, recomputed)
    for entries in (1, 99 * 5, 99 * 17):  # one token a slice; slices across rows' ends
        sliced = token_checks(rows, recomputed, max_entries=entries)
        for a, b in zip(whole[0] + whole[1], sliced[0] + sliced[1], strict=True):
            assert torch.equal(a, b)


def _one_file(tmp_path: Path, name: str, **kw: Any) -> bytes:
    settings = InferenceSettings(node_address=NODE, output_dir=tmp_path / name, batch_size=3, n=2,
                                 max_new_tokens=12, max_batches=1, checkpoint_cache=tmp_path / "ckpt",
                                 **kw)  # fmt: skip
    report = InferenceWorkload(settings).run_batch()
    assert report is not None
    return Path(report.path).read_bytes()


def test_a_file_made_on_the_explicit_cpu_is_the_default_one_byte_for_byte(
    tmp_path: Path, no_gpu: None, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv("INTELLECT_SOCKET_PATH", raising=False)
    default = _one_file(tmp_path, "default")
    assert _one_file(tmp_path, "cpu", device="cpu") == default
    assert _one_file(tmp_path, "auto", device="auto") == default


def test_cuda_asked_where_there_is_none_is_refused_at_start(tmp_path: Path, no_gpu: None):
    with pytest.raises(DeviceSettingError, match="set the device to auto or cpu"):
        InferenceWorkload(InferenceSettings(device="cuda", output_dir=tmp_path / "out"))
    result = CliRunner().invoke(validator_app, ["check", str(tmp_path / "x.parquet"), "--device", "cuda"])
    assert result.exit_code == 2 and "--device: device 'cuda' asked for" in result.output
    result = CliRunner().invoke(validator_app, ["check", str(tmp_path / "x.parquet")],
                                env={"INTELLECT_VALIDATOR_DEVICE": "cuda:1"})  # fmt: skip
    assert result.exit_code == 2 and "device 'cuda:1' asked for" in result.output
