"""What runs inside vLLM's engine (its worker process, or the caller's with the in-process engine):
the project's seeded draw as a V1 batch logits processor, and the trace of every decoded token's
final-norm hidden state and logprob, kept per request until the backend takes it.

**The draw** (`GumbelDraw`): for each of our requests in the batch, the token our Gumbel-max sampler
picks (workloads/model/sampler.py) from the engine's real logits, with the request's seed and
temperature (from `SamplingParams.extra_args`) and its position = the number of tokens it has output
so far; every other logit is set to -inf and the engine samples greedily, so the engine's token is
the draw a validator replays. The chosen token's logprob under the temperature-scaled distribution
is computed from the same logits (what TorchBackend reports) and traced.

**The hidden states** (`TraceExtension`, mixed into vLLM's worker): a forward hook on the final norm
records, for every token of every forward, the row of its request at its output index
(position − prompt length; prompt positions are skipped). vLLM flattens a batch's requests into one
token dimension; the runner's request order and offsets (`query_start_loc`) say which rows are whose,
and each request is named by our key in its `extra_args`, never by its place in the batch. A request
preempted and recomputed writes the same indices again (the recomputed rows replace the old ones), so
whatever the scheduler does, each output index holds one row. Decoding is never repeated to get them.

The backend side (workloads/model/vllm_backend.py) takes a request's trace with `collective_rpc`
once its output is done. Every vLLM internal used here comes from workloads/model/vllm_internals.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from workloads.model import sampler
from workloads.model import vllm_internals as vi

_LogitsProcessor, _process_dict_updates, _ = vi.logits_processor_api()
T = TypeVar("T")
Taken = tuple[torch.Tensor | None, list[float]]  # a request's (hidden rows, logprobs), as handed out


@dataclass
class RequestTrace:
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)  # output index -> [hidden] row
    logprobs: dict[int, float] = field(default_factory=dict)  # output index -> chosen token's logprob


TRACES: dict[str, RequestTrace] = {}
"""The traces of this process's requests by our key (one engine per process; see vllm_backend)."""
RECOMPUTED = [0]  # hidden rows written again (a preempted request recomputed): a count for stats and tests


def _trace(key: str) -> RequestTrace:
    found = TRACES.get(key)
    if found is None:
        found = TRACES[key] = RequestTrace()
    return found


@dataclass
class _Drawn:
    key: str
    seed: int
    temperature: float
    output: list[int]  # the request's running output tokens (a live reference, vLLM's own list)


def _drawn(params: Any, _prompt: list[int] | None, output: list[int]) -> _Drawn | None:
    extra = vi.extra_of(params)
    if extra is None:
        return None
    return _Drawn(str(extra["key"]), int(extra["seed"]), float(extra["temperature"]), output)


class GumbelDraw(_LogitsProcessor):  # type: ignore[misc, valid-type]
    """The seeded Gumbel-max draw imposed on the engine (the module's docstring)."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, _Drawn] = {}  # persistent batch index -> our request

    def is_argmax_invariant(self) -> bool:
        return False  # it decides the argmax: applied before greedy sampling

    def update_state(self, batch_update: Any) -> None:
        _process_dict_updates(self.rows, batch_update, _drawn)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        by_temperature: dict[float, list[int]] = {}
        for index, row in self.rows.items():
            by_temperature.setdefault(row.temperature, []).append(index)
        for temperature, indexes in by_temperature.items():
            rows = [self.rows[i] for i in indexes]
            positions = [len(r.output) for r in rows]
            where = torch.tensor(indexes, device=logits.device)
            picked = logits.index_select(0, where)
            chosen, logprobs = sampler.sample(picked, [r.seed for r in rows], positions, temperature)
            for row, position, lp in zip(rows, positions, logprobs.tolist(), strict=True):
                _trace(row.key).logprobs[position] = lp
            forced = torch.full_like(picked, float("-inf"))
            forced.scatter_(1, chosen.view(-1, 1).to(logits.device), 0.0)
            logits.index_copy_(0, where, forced)
        return logits


class TraceExtension:
    """Mixed into vLLM's worker class (`worker_extension_cls`); its methods are what the backend
    calls with `collective_rpc`. `self` is the worker."""

    def intellect_install(self) -> tuple[int, str, str]:
        """Hooks on the model: positions in (the model's own argument), final norm out. Returns the
        hidden size and dtype of what the norm makes (a one-token completion's empty rows), and the
        device type the model runs on (what the files say: a CUDA build may run on the GPU whatever the
        settings asked)."""
        runner = vi.runner_of(self)
        model = vi.model_of(runner)
        weight = vi.final_norm(model).weight
        assert isinstance(weight, torch.Tensor)
        shape = (int(weight.shape[0]), str(weight.dtype).removeprefix("torch."), weight.device.type)
        if getattr(model, "_intellect_hooks", None):
            return shape
        state: dict[str, torch.Tensor] = {}

        def positions(_module: Any, args: tuple, kwargs: dict[str, Any]) -> None:
            state["positions"] = vi.positions_of(args, kwargs)

        def norm(_module: Any, _inputs: Any, output: Any) -> None:
            _record(runner, state["positions"], vi.norm_output(output))

        model._intellect_hooks = (  # type: ignore[assignment]
            model.register_forward_pre_hook(positions, with_kwargs=True),
            vi.final_norm(model).register_forward_hook(norm),
        )
        return shape

    def intellect_take(self, keys: list[str]) -> tuple[dict[str, Taken], int]:
        """Each key's trace, handed out once: (hidden rows 0..k-1 stacked on the CPU, or None when the
        request kept none; logprobs 0..m-1), contiguous from index 0 (a gap ends them: the backend
        checks the lengths against the tokens); and how many rows were recomputed so far."""
        out: dict[str, Taken] = {}
        for key in keys:
            trace = TRACES.pop(key, RequestTrace())
            rows = _contiguous(trace.hidden)
            hidden = torch.stack(rows).cpu() if rows else None
            out[key] = (hidden, _contiguous(trace.logprobs))
        return out, RECOMPUTED[0]

    def intellect_drop(self) -> int:
        """Forget every trace (a batch that failed half-way); returns how many there were."""
        count = len(TRACES)
        TRACES.clear()
        return count

    def intellect_load_weights(self, state: dict[str, torch.Tensor]) -> int:
        """Serve other weights (a trainer's checkpoint), named as in the Hugging Face checkpoint."""
        vi.reload_weights(self, state.items())
        return len(state)


def _contiguous(by_index: dict[int, T]) -> list[T]:
    out: list[T] = []
    while len(out) in by_index:
        out.append(by_index[len(out)])
    return out


def _record(runner: Any, positions: torch.Tensor, hidden: torch.Tensor) -> None:
    """One forward's rows to their requests' traces: one gather over the flat token dimension."""
    layout = list(vi.batch_layout(runner))
    if not layout:
        return  # a warm-up or profiling forward: no requests
    where = positions[: max(end for _, _, end in layout)].tolist()  # one copy per forward, not per row
    flat: list[int] = []
    owners: list[tuple[str, int]] = []
    for req_id, start, end in layout:
        prompt, extra = vi.request_state(runner, req_id)
        if extra is None or not extra.get("hidden", True) or end <= start:
            continue
        for token in range(start, end):
            position = where[token]
            if position >= prompt:
                flat.append(token)
                owners.append((str(extra["key"]), position - prompt))
    if not flat:
        return
    rows = hidden.index_select(0, torch.tensor(flat, device=hidden.device))
    for (key, index), row in zip(owners, rows, strict=True):
        trace = _trace(key)
        RECOMPUTED[0] += index in trace.hidden
        trace.hidden[index] = row
