"""What tests/workloads/test_workloads_vllm.py runs in vLLM's environment (.venv-vllm), one engine per
run: `python tests/workloads/vllm_job.py OUT MODE` writes OUT/result.json and the rollout files.

mode `main`: the internals check; the Gumbel noise as this environment's numpy draws it; the vLLM
backend beside the torch backend on the same prompts and seeds (tokens, EOS and length, logprobs,
hidden states); the inference workload with backend=vllm writing honest files at base weights and at a
checkpoint loaded into the running engine, and the perturbed-model cheat (the same engine).
mode `preempt`: a KV cache of a few blocks, so vLLM preempts and recomputes requests mid-decode; the
workload's files written under it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
NODE = "0x00000000000000000000000000000000000000b7"


def compare(out: Path, eos: int | None = None, tokens: int = 24) -> dict:
    """The vLLM backend and the torch backend on the same 16 prompts and seeds (EOS off: eos=-1)."""
    from workloads.model.backends import TorchBackend
    from workloads.model.loading import load_model, load_tokenizer
    from workloads.model.vllm_backend import VLLMBackend

    tok = load_tokenizer("tiny")
    texts = ["12+34=", "rev abcdef=", "sort 93412=", "7+5="]
    prompts = [tok(t)["input_ids"] for t in texts for _ in range(4)]
    seeds = list(range(500, 516))
    eos = tok.eos_token_id if eos is None else eos
    engine = VLLMBackend.shared(str(ROOT / "workloads/model/tiny"), eos_token_id=eos, cpu=True)
    ours = engine.generate(prompts, seeds, max_new_tokens=tokens, temperature=1.0)
    ref = TorchBackend(load_model("tiny"), eos, tok.pad_token_id).generate(
        prompts, seeds, max_new_tokens=tokens, temperature=1.0
    )
    one = engine.generate(prompts[:2], seeds[:2], max_new_tokens=1, temperature=1.0)
    rows = []
    for a, r in zip(ours, ref, strict=True):
        row = {"tokens": a.tokens, "ref_tokens": r.tokens, "finished": a.finished,
               "hidden_rows": int(a.hidden.shape[0]), "logprobs": len(a.logprobs)}  # fmt: skip
        if a.tokens == r.tokens and len(a.tokens) > 1:
            diff = (a.hidden.float() - r.hidden.float()).norm() / r.hidden.float().norm()
            row["hidden_rel_l2"] = float(diff)
            row["logprob_max_diff"] = max(abs(x - y) for x, y in zip(a.logprobs, r.logprobs, strict=True))
        rows.append(row)
    return {"rows": rows, "eos": eos,
            "one_token": [[len(c.tokens), list(c.hidden.shape)] for c in one]}  # fmt: skip


def workload_files(out: Path, **extra: object) -> tuple[list[str], dict]:
    from workloads.inference.settings import InferenceSettings
    from workloads.inference.workload import InferenceWorkload

    made = InferenceWorkload(InferenceSettings(
        node_address=extra.pop("node", NODE), output_dir=out, batch_size=4, n=4, max_new_tokens=32,
        target_lengths=[8, 12], backend="vllm", device="cpu", **extra,
    ))  # fmt: skip
    paths = []
    for _ in range(2):
        report = made.run_batch()
        assert report is not None
        paths.append(report.path)
    assert made.vllm is not None
    return paths, dict(made.vllm.stats.extra)


def main(out: Path, mode: str) -> None:
    from workloads.model import sampler, vllm_internals

    result: dict = {"mode": mode}
    started = time.perf_counter()
    if mode == "main":
        result["internals"] = vllm_internals.check()
        result["noise"] = sampler.noise_matrix([3, 2**62 + 5], [0, 17], 99).numpy().tolist()
        result["numpy"] = np.__version__
        result["compare"] = compare(out)
        result["base"], result["stats"] = workload_files(out / "base")
        ckpt = out / "ckpt"
        ckpt.mkdir()
        from safetensors.torch import save_file

        from workloads.model.loading import load_model

        model = load_model("tiny")  # a "trainer's step": N(0, 2e-3) on every weight (missing it fails)
        gen = torch.Generator().manual_seed(11)
        state = {k: (v + torch.randn(v.shape, generator=gen).to(v.dtype) * 0.002).contiguous()
                 for k, v in model.state_dict().items()}  # fmt: skip
        save_file(state, str(ckpt / "step_1.safetensors"))
        import hashlib

        digest = hashlib.sha256((ckpt / "step_1.safetensors").read_bytes()).hexdigest()
        (ckpt / "step_1.safetensors.sha256").write_text(digest + "\n")
        result["checkpoint"], _ = workload_files(
            out / "step1", step=1, checkpoint_source=str(ckpt / "step_{step}.safetensors"),
            checkpoint_cache=out / "cache",
        )  # fmt: skip
        result["cheat"], _ = workload_files(out / "cheat", cheat="perturbed-model",
                                            node="0x00000000000000000000000000000000000000c8")  # fmt: skip
        from workloads.model.vllm_backend import VLLMBackend

        result["engines"] = len(VLLMBackend._shared)
    else:
        from workloads.model.vllm_backend import VLLMBackend

        # 4 blocks of 32 tokens for 16 requests of up to 40: vLLM must preempt and recompute
        engine = VLLMBackend.shared(str(ROOT / "workloads/model/tiny"), cpu=True, block_size=32,
                                    max_model_len=64, num_gpu_blocks_override=4, max_num_seqs=16)  # fmt: skip
        result["files"], _ = workload_files(out / "preempt")
        # rows that outgrow their block while others hold the rest: fixed length (EOS off), 50 tokens
        engine.eos_token_id = -1
        result["compare"] = compare(out, eos=-1, tokens=50)
        result["stats"] = dict(engine.stats.extra)
    result["seconds"] = time.perf_counter() - started
    (out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
