"""build_model: the language model of a model config, recurrent (LMConfig) or transformer (TransformerConfig)."""

from __future__ import annotations

from samu.models.config import LMConfig, TransformerConfig
from samu.models.model import CausalLM, LanguageModel
from samu.models.transformer import TransformerLM


def build_model(config, *, backend: str = "auto", device=None, dtype=None) -> CausalLM:
    """A LanguageModel of an LMConfig (mixers on ``backend``), or a TransformerLM of a TransformerConfig."""
    if isinstance(config, TransformerConfig):
        return TransformerLM(config, device=device, dtype=dtype)
    if isinstance(config, LMConfig):
        return LanguageModel(config, backend=backend, device=device, dtype=dtype)
    raise TypeError(f"config must be an LMConfig or a TransformerConfig, got {type(config).__name__}")
