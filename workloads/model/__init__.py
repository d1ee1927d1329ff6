"""Models for the workloads: the shipped tiny model, loading, backends, sampling and prefill."""

from workloads.model.backends import Completion, InferenceBackend, TorchBackend
from workloads.model.loading import TINY_MODEL_DIR, load_model, load_tokenizer, load_weights
from workloads.model.prefill import PrefillResult, prefill, prefill_batch
from workloads.model.vllm_backend import VLLMBackend

__all__ = [
    "TINY_MODEL_DIR",
    "Completion",
    "InferenceBackend",
    "PrefillResult",
    "TorchBackend",
    "VLLMBackend",
    "load_model",
    "load_tokenizer",
    "load_weights",
    "prefill",
    "prefill_batch",
]
