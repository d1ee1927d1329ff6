"""Every vLLM internal the vLLM backend touches, named here and nowhere else.

vLLM's public API (`LLM`, `SamplingParams`, `TokensPrompt`, `collective_rpc`) cannot impose the
project's seeded Gumbel draw or hand out the final norm's hidden states of the decoded tokens, which
the TOPLOC proofs commit to. So the backend (workloads/model/vllm_engine.py, vllm_backend.py) reaches
into the engine, and only through the functions of this module:

- the V1 batch logits processor interface (`LogitsProcessor`, `BatchUpdate`, `process_dict_updates`),
  documented for custom processors but living under `vllm.v1`;
- the worker's model runner (`worker.model_runner`), its model (`runner.model`, with the decoder's
  final norm at `model.model.norm`), the persistent batch's request order
  (`runner.input_batch.req_ids`), where each request's tokens sit in the flat token dimension
  (`runner.query_start_loc.np`), and each request's state (`runner.requests[id]`: `num_prompt_tokens`,
  `sampling_params.extra_args`);
- the worker's `reload_weights(weights_iterator=...)`, to serve a trainer's checkpoint in place.

A vLLM upgrade that moves any of them fails `check()` (run by `make vllm` and by
tests/workloads/model/test_vllm_backend.py) naming what moved, instead of making proofs that no
validator accepts. `PINNED` is the version these names were read from; the CUDA build
(`vllm==0.33.0`) keeps the same names (docs/performance.md, "vLLM on a GPU").
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

PINNED = ("0.32.0", "0.33.0")  # the CPU build's version (requirements-vllm.lock), the CUDA build's
EXTRA_KEY = "intellect"  # our per-request values travel in SamplingParams.extra_args[EXTRA_KEY]
WORKER_EXTENSION = "workloads.model.vllm_engine.TraceExtension"
LOGITS_PROCESSOR = "workloads.model.vllm_engine:GumbelDraw"  # vLLM wants "<module>:<class>"
# In-process engine on a CPU: one process (the engine core in the caller's), the KV cache in GiB, the
# OpenMP threads bound to the cores this machine has. Set only where the caller has not.
CPU_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": f"0-{max(0, (os.cpu_count() or 1) - 1)}",
}
# Engine arguments the backend depends on: eager mode (the hooks run on every forward; a compiled
# graph would skip them), synchronous scheduling (the draw's position is the output length when the
# processor runs), our processor and worker extension.
ENGINE_ARGS = {"enforce_eager": True, "async_scheduling": False, "enable_prefix_caching": True}


class VLLMInternalsMoved(RuntimeError):
    """The installed vLLM lacks an internal this backend relies on (an upgrade moved it)."""


def installed_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    for dist in ("vllm-cpu", "vllm"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def _moved(what: str, error: BaseException | None = None) -> VLLMInternalsMoved:
    have = installed_version() or "(not installed)"
    return VLLMInternalsMoved(
        f"vLLM {have} has no {what} (read from vLLM {' / '.join(PINNED)}): update "
        f"workloads/model/vllm_internals.py for this version{f' ({error})' if error else ''}"
    )


def logits_processor_api() -> tuple[type, Any, Any]:
    """(LogitsProcessor base class, process_dict_updates, MoveDirectionality)."""
    try:
        from vllm.v1.sample.logits_processor import LogitsProcessor, MoveDirectionality  # noqa: PLC0415
        from vllm.v1.sample.logits_processor.builtin import process_dict_updates  # noqa: PLC0415
    except ImportError as exc:
        raise _moved("V1 batch logits processor interface", exc) from None
    return LogitsProcessor, process_dict_updates, MoveDirectionality


def runner_of(worker: Any) -> Any:
    runner = getattr(worker, "model_runner", None)
    if runner is None:
        raise _moved("worker.model_runner")
    return runner


def model_of(runner: Any) -> nn.Module:
    model = getattr(runner, "model", None)
    if not isinstance(model, nn.Module):
        raise _moved("model_runner.model")
    return model


def final_norm(model: nn.Module) -> nn.Module:
    """The decoder's last norm (Llama/Qwen/Mistral-style vLLM models: `model.model.norm`)."""
    inner = getattr(model, "model", None)
    norm = getattr(inner, "norm", None)
    if not isinstance(norm, nn.Module):
        raise _moved(f"final norm at {type(model).__name__}.model.norm")
    return norm


def norm_output(output: Any) -> torch.Tensor:
    """vLLM's RMSNorm returns (normed, residual) when given a residual, else the normed tensor."""
    return output[0] if isinstance(output, tuple) else output


def positions_of(args: tuple, kwargs: dict[str, Any]) -> torch.Tensor:
    """The absolute position of every token of a forward, from the model's own arguments
    (`model(input_ids=..., positions=...)` in the runner's `_model_forward`)."""
    positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
    if not isinstance(positions, torch.Tensor):
        raise _moved("`positions` argument of the model's forward")
    return positions


def batch_layout(runner: Any) -> Iterator[tuple[str, int, int]]:
    """(request id, first flat token, end) of each request in the forward being run."""
    try:
        req_ids = list(runner.input_batch.req_ids)
        starts = runner.query_start_loc.np
    except AttributeError as exc:
        raise _moved("input_batch.req_ids / query_start_loc.np on the model runner", exc) from None
    for i, req_id in enumerate(req_ids):
        yield req_id, int(starts[i]), int(starts[i + 1])


def request_state(runner: Any, req_id: str) -> tuple[int, dict[str, Any] | None]:
    """(prompt length, our extra_args or None) of one request the runner holds."""
    try:
        state = runner.requests[req_id]
        prompt, params = int(state.num_prompt_tokens), state.sampling_params
    except (AttributeError, KeyError) as exc:
        raise _moved("model_runner.requests[id].num_prompt_tokens / sampling_params", exc) from None
    extra = getattr(params, "extra_args", None) or {}
    return prompt, extra.get(EXTRA_KEY)


def extra_of(params: Any) -> dict[str, Any] | None:
    """Our values in a request's SamplingParams (None: not one of ours)."""
    return (getattr(params, "extra_args", None) or {}).get(EXTRA_KEY)


def reload_weights(worker: Any, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Weights loaded in place into the running engine, named as in the Hugging Face checkpoint
    (`Worker.reload_weights`: the model's own `load_weights` fails once the engine has started, its
    parameters' loaders having been stripped after the first load)."""
    reload = getattr(worker, "reload_weights", None)
    if not callable(reload):
        raise _moved("Worker.reload_weights")
    reload(weights_iterator=iter(weights), is_checkpoint_format=True)


def check() -> list[str]:
    """What of the above the installed vLLM lacks, checked without starting an engine ([] = all there).
    Instance fields set in `__init__` are looked for in its source; the live test exercises them."""
    problems: list[str] = []
    try:
        import vllm  # noqa: PLC0415
        from vllm import LLM, SamplingParams, TokensPrompt  # noqa: F401, PLC0415
        from vllm.engine.arg_utils import EngineArgs  # noqa: PLC0415
        from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch  # noqa: PLC0415
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # noqa: PLC0415
    except ImportError as exc:
        return [f"import: {exc}"]
    try:
        logits_processor_api()
    except VLLMInternalsMoved as exc:
        problems.append(str(exc))
    fields = set(getattr(EngineArgs, "__dataclass_fields__", {}))
    for arg in (*ENGINE_ARGS, "logits_processors", "worker_extension_cls"):
        if arg not in fields:
            problems.append(f"EngineArgs.{arg}")
    if "extra_args" not in inspect.signature(SamplingParams).parameters:
        problems.append("SamplingParams(extra_args=...)")
    if not callable(getattr(LLM, "collective_rpc", None)):
        problems.append("LLM.collective_rpc")
    from vllm.v1.worker.gpu_worker import Worker  # noqa: PLC0415

    if "weights_iterator" not in inspect.signature(GPUModelRunner.reload_weights).parameters or not callable(
        getattr(Worker, "reload_weights", None)
    ):
        problems.append("Worker.reload_weights(weights_iterator=...)")
    if not isinstance(inspect.getattr_static(InputBatch, "req_ids", None), property):
        problems.append("InputBatch.req_ids")
    runner_init = inspect.getsource(GPUModelRunner.__init__)
    for name in ("self.query_start_loc", "self.requests", "self.input_batch"):
        if name not in runner_init:
            problems.append(f"GPUModelRunner.__init__ sets {name}")
    if "sampling_params" not in getattr(CachedRequestState, "__dataclass_fields__", {}):
        problems.append("CachedRequestState.sampling_params")
    if "num_prompt_tokens" not in inspect.getsource(CachedRequestState):
        problems.append("CachedRequestState.num_prompt_tokens")
    if vllm.__version__.split("+")[0] not in PINNED:
        problems.append(f"version {vllm.__version__} (names read from {' / '.join(PINNED)}): re-read them")
    return problems


def main() -> int:
    """`python -m workloads.model.vllm_internals` (`make vllm` runs it): the check, and no CUDA-linked
    extras importable beside the CPU build."""
    for key, value in CPU_ENV.items():
        os.environ.setdefault(key, value)
    problems = check()
    import importlib.util  # noqa: PLC0415

    if not torch.cuda.is_available():
        extras = [m for m in ("torchvision", "torchaudio", "torchcodec") if importlib.util.find_spec(m)]
        problems += [f"{m} is installed: PyPI's build links CUDA and breaks `import vllm`" for m in extras]
    for problem in problems:
        print(f"vllm_internals: {problem}", file=sys.stderr)
    if not problems:
        import vllm  # noqa: PLC0415

        print(f"vllm_internals: vLLM {vllm.__version__}: every internal the backend uses is there")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
