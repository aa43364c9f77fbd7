"""samu: fast, exact recurrent sequence mixers (SAMU and RG-LRU) for PyTorch."""

from samu import reference
from samu.models import LanguageModel, LMConfig, generate
from samu.modules import Conv1D, GatedMLP, RecurrentBlock, ResidualLayer, RGLRUMixer, RMSNorm, SAMUMixer
from samu.ops import dispatch
from samu.ops.checks import set_check_finite
from samu.ops.functional import rglru_mixer, samu_mixer

__version__ = "0.1.0"

__all__ = ["samu_mixer", "rglru_mixer", "SAMUMixer", "RGLRUMixer", "reference", "dispatch",
           "set_check_finite", "__version__",
           "RecurrentBlock", "ResidualLayer", "Conv1D", "RMSNorm", "GatedMLP", "LMConfig", "LanguageModel",
           "generate"]
