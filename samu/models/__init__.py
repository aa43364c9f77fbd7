"""Language models: LMConfig (+ presets), LanguageModel, generate(), checkpoints."""

from samu.models.checkpoint import CheckpointError, load_checkpoint, load_model, save_checkpoint
from samu.models.config import PRESETS, LMConfig
from samu.models.generate import generate
from samu.models.model import LanguageModel

__all__ = ["LMConfig", "PRESETS", "LanguageModel", "generate", "save_checkpoint", "load_checkpoint",
           "load_model", "CheckpointError"]
