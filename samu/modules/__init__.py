"""Layers: the two mixers, Conv1D, RMSNorm, gated MLP, Griffin's RecurrentBlock, residual layer."""

from samu.modules.block import BlockState, RecurrentBlock, ResidualLayer
from samu.modules.layers import Conv1D, GatedMLP, RMSNorm
from samu.modules.mixers import RGLRUMixer, SAMUMixer

__all__ = ["SAMUMixer", "RGLRUMixer", "Conv1D", "RMSNorm", "GatedMLP", "RecurrentBlock", "ResidualLayer",
           "BlockState"]
