"""Layers: the two mixers, Conv1D, RMSNorm, gated MLP, Griffin's RecurrentBlock, residual layer."""

from samu.modules.mixers import RGLRUMixer, SAMUMixer

__all__ = ["SAMUMixer", "RGLRUMixer"]
