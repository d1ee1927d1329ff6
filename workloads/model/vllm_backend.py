"""The vLLM backend: rollouts from vLLM's V1 engine with the project's seeded draw and TOPLOC's hidden
states, so a validator's torch prefill judges them like TorchBackend's (under the calibration record's
vLLM part: workloads/inference/judge/calibration.py).

Installed on its own (`make vllm`: .venv-vllm, requirements-vllm.lock); the CPU suite never imports
vLLM. What happens inside the engine is workloads/model/vllm_engine.py; every vLLM internal either
touches is named in workloads/model/vllm_internals.py.

One engine per process (`VLLMBackend.shared`): starting one costs 5 s on a quiet 2-core CPU and up to
60 s on a loaded one (the model's load, the KV cache's allocation, the profiling run), so a task
process starts it once and reuses it for all its batches, and new checkpoints are loaded into it
(`load_checkpoint`) rather than restarting it.
`stats.extra["startup_seconds"]` says what the start cost.

Rows: each completion is a request named by a key of ours in `SamplingParams.extra_args`; its tokens
come from vLLM's output, its logprobs and hidden states from the engine's trace under that key
(`collective_rpc("intellect_take")`), so neither depends on where vLLM placed the request in its
batch, nor on preemption (recomputed indices are written again, never appended). EOS and length as
TorchBackend: a completion stops after the EOS token (kept) or at `max_new_tokens`.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

import torch
from safetensors.torch import load_file

from workloads.model import vllm_internals as vi
from workloads.model.backends import Completion, GenerationStats, check_batch

VLLM_PYTHON_ENV = "INTELLECT_VLLM_PYTHON"
ROOT = Path(__file__).resolve().parents[2]


class VLLMMissing(RuntimeError):
    """No environment with vLLM here; the message says how to make one."""


def vllm_python() -> str:
    """The interpreter of the vLLM environment, for whoever runs the vLLM backend in a process of its own
    (a devnet's workers, `intellect-validator calibrate --backend vllm`, the tests, the bench):
    $INTELLECT_VLLM_PYTHON, else the repository's .venv-vllm (`make vllm`), else this interpreter where
    it imports vLLM."""
    given = os.environ.get(VLLM_PYTHON_ENV)
    if given:
        if not os.access(given, os.X_OK):
            raise VLLMMissing(f"{VLLM_PYTHON_ENV}={given} is not an interpreter here")
        return given
    local = ROOT / ".venv-vllm" / "bin" / "python"
    if local.is_file():
        return str(local)
    import importlib.util  # noqa: PLC0415

    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise VLLMMissing(f"the vllm backend needs vLLM's environment: run `make vllm`, or set {VLLM_PYTHON_ENV}")


class VLLMBackend:
    _shared: ClassVar[dict[tuple[str, str], VLLMBackend]] = {}

    def __init__(self, model: str, *, dtype: str = "bfloat16", eos_token_id: int | None = None,
                 cpu: bool | None = None, **engine_args: Any) -> None:  # fmt: skip
        """Start an engine for `model` (a local folder or a hub name). `cpu`: the in-process CPU
        engine's environment (None: when PyTorch sees no GPU)."""
        if cpu if cpu is not None else not torch.cuda.is_available():
            for key, value in vi.CPU_ENV.items():
                os.environ.setdefault(key, value)
        started = time.perf_counter()
        from vllm import LLM  # noqa: PLC0415 - optional install (`make vllm`)

        self.model = model
        self.dtype = dtype
        self.llm = LLM(
            model=model, dtype=dtype, logits_processors=[vi.LOGITS_PROCESSOR],
            worker_extension_cls=vi.WORKER_EXTENSION, **{**vi.ENGINE_ARGS, **engine_args},
        )  # fmt: skip
        hidden_size, hidden_dtype, self.device = self.llm.collective_rpc("intellect_install")[0]
        self._empty = torch.empty((0, int(hidden_size)), dtype=getattr(torch, hidden_dtype))
        tokenizer = self.llm.get_tokenizer()
        self.eos_token_id = int(eos_token_id if eos_token_id is not None else tokenizer.eos_token_id)
        self.stats = GenerationStats(extra={"startup_seconds": time.perf_counter() - started})
        self._keys = itertools.count()
        self.serving = "base"  # which weights the engine serves (load_state)

    @classmethod
    def shared(cls, model: str, *, dtype: str = "bfloat16", **kwargs: Any) -> VLLMBackend:
        """This process's engine for (model, dtype), started on first use. Asking for another model or
        dtype shuts the running engine down first: two engines would hold two KV caches."""
        key = (model, dtype)
        if key not in cls._shared:
            for other in list(cls._shared):
                cls._shared.pop(other).close()
            cls._shared[key] = cls(model, dtype=dtype, **kwargs)
        return cls._shared[key]

    def close(self) -> None:
        engine = getattr(self.llm, "llm_engine", None)
        core = getattr(engine, "engine_core", None)
        if core is not None and callable(getattr(core, "shutdown", None)):
            core.shutdown()
        del self.llm
        import gc  # noqa: PLC0415

        gc.collect()

    def generate(
        self,
        prompts: list[list[int]],
        seeds: list[int],
        *,
        max_new_tokens: int,
        temperature: float,
        capture_hidden: bool = True,
    ) -> list[Completion]:
        from vllm import SamplingParams, TokensPrompt  # noqa: PLC0415

        if not check_batch(prompts, seeds, max_new_tokens):
            return []
        started = time.perf_counter()
        keys = [f"r{next(self._keys)}" for _ in prompts]
        fixed = self.eos_token_id < 0  # benches: every row decodes max_new_tokens (TorchBackend's EOS -1)
        stop = [] if fixed else [self.eos_token_id]
        params = [
            SamplingParams(
                max_tokens=max_new_tokens, temperature=0.0, stop_token_ids=stop, ignore_eos=fixed,
                detokenize=False,
                extra_args={vi.EXTRA_KEY: {"key": key, "seed": int(seed), "temperature": float(temperature),
                                           "hidden": capture_hidden}},
            )  # fmt: skip
            for key, seed in zip(keys, seeds, strict=True)
        ]
        try:
            outputs = self.llm.generate(
                [TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False
            )
            traces, recomputed = self.llm.collective_rpc("intellect_take", args=(keys,))[0]
            self.stats.extra["recomputed_rows"] = float(recomputed)  # preempted requests' rows, again
        except BaseException:
            self.llm.collective_rpc("intellect_drop")
            raise
        results = [
            self._completion(key, out, traces[key], capture_hidden)
            for key, out in zip(keys, outputs, strict=True)
        ]
        self.stats.seconds += time.perf_counter() - started
        self.stats.output_tokens += sum(len(c.tokens) for c in results)
        return results

    def _completion(self, key: str, output: Any, trace: tuple[torch.Tensor | None, list[float]],
                    capture_hidden: bool) -> Completion:  # fmt: skip
        tokens = [int(t) for t in output.outputs[0].token_ids]
        hidden, logprobs = trace
        if len(logprobs) < len(tokens):
            raise RuntimeError(f"vLLM request {key}: {len(logprobs)} drawn logprobs for {len(tokens)} tokens "
                               "(was the draw not applied? workloads/model/vllm_engine.py)")  # fmt: skip
        if capture_hidden:
            have = 0 if hidden is None else hidden.shape[0]
            if have < len(tokens) - 1:
                raise RuntimeError(f"vLLM request {key}: hidden states of {have} decode positions for "
                                   f"{len(tokens)} tokens (need {len(tokens) - 1})")  # fmt: skip
            hidden = hidden[: len(tokens) - 1].clone() if hidden is not None else self._empty.clone()
        finished = bool(tokens) and tokens[-1] == self.eos_token_id
        return Completion(tokens, logprobs[: len(tokens)], hidden if capture_hidden else None, finished)

    def load_state(self, state: dict[str, torch.Tensor], serving: str = "other") -> None:
        """Serve these weights (Hugging Face names) from now on; cached prefixes are dropped.
        `serving` names them (`self.serving`: "base" for the model's own, as the engine starts)."""
        self.llm.collective_rpc("intellect_load_weights", args=(state,))
        self.llm.reset_prefix_cache()
        self.serving = serving

    def load_checkpoint(self, path: str | Path) -> None:
        self.load_state(load_file(str(path)), serving=str(path))
