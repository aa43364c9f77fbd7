"""Language models: LMConfig (+ presets), LanguageModel, TransformerLM (the reference point), generate(),
checkpoints."""

from samu.models.build import build_model
from samu.models.checkpoint import CheckpointError, is_sharded, load_checkpoint, load_model, save_checkpoint
from samu.models.config import PRESETS, LMConfig, TransformerConfig
from samu.models.generate import generate
from samu.models.model import CausalLM, LanguageModel
from samu.models.transformer import TransformerLM

__all__ = ["LMConfig", "TransformerConfig", "PRESETS", "CausalLM", "LanguageModel", "TransformerLM",
           "build_model", "generate", "save_checkpoint", "load_checkpoint", "load_model", "is_sharded",
           "CheckpointError"]
