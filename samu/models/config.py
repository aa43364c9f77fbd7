"""LMConfig: the shape of a language model, with named presets."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from samu.modules.block import MIXERS
from samu.validate import finite_number, positive_int


@dataclass(frozen=True)
class LMConfig:
    """Shape of a ``LanguageModel``; ``lru_width=None`` means ``width``."""

    vocab_size: int = 256
    width: int = 128
    num_layers: int = 4
    mixer: str = "samu"
    lru_width: int | None = None
    num_heads: int = 16
    conv_width: int = 4
    mlp_expansion: int = 3
    norm_eps: float = 1e-6

    def __post_init__(self):
        for name in ("vocab_size", "width", "num_layers", "num_heads", "conv_width", "mlp_expansion"):
            positive_int(name, getattr(self, name))
        if self.lru_width is not None:
            positive_int("lru_width", self.lru_width)
        if self.mixer not in MIXERS:
            raise ValueError(f"mixer must be one of {', '.join(map(repr, MIXERS))}, got {self.mixer!r}")
        if self.mixer == "samu" and self.mixer_width % 2:
            name = "lru_width" if self.lru_width is not None else "width (the mixer width when lru_width is unset)"
            raise ValueError(f"{name} must be even for mixer='samu', got {self.mixer_width}")
        if self.mixer == "rglru" and self.mixer_width % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} must divide lru_width={self.mixer_width} "
                             f"for mixer='rglru'")
        finite_number("norm_eps", self.norm_eps, positive=True)

    @property
    def mixer_width(self) -> int:
        return self.width if self.lru_width is None else self.lru_width

    @classmethod
    def preset(cls, name: str, **overrides) -> "LMConfig":
        """A named preset (``PRESETS``), with fields replaced by ``overrides``."""
        if not isinstance(name, str) or name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
        return dataclasses.replace(PRESETS[name], **overrides)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "LMConfig":
        config = model_config_from_dict(d)
        if not isinstance(config, LMConfig):
            raise ValueError(f"expected a recurrent model's config, got a {config.arch} one")
        return config

    def num_params(self) -> int:
        """Parameter count of ``LanguageModel(self)`` (the tied head adds none)."""
        D, E, K = self.width, self.mixer_width, self.conv_width
        if self.mixer == "samu":
            mixer = 3 * E + 4
        else:
            mixer = 2 * E * E // self.num_heads + 3 * E
        block = 2 * (D * E + E) + K * E + E + mixer + (E * D + D)
        hidden = self.mlp_expansion * D
        mlp = (D * 2 * hidden + 2 * hidden) + (hidden * D + D)
        layer = 2 * D + block + mlp
        return self.vocab_size * D + self.num_layers * layer + D


@dataclass(frozen=True)
class TransformerConfig:
    """Shape of a ``TransformerLM`` (samu.models.transformer), the reference point samu's recurrent models
    are compared with: a pre-norm causal transformer of ``width`` (a multiple of 64) and ``num_layers``,
    head dim 128 (64 where the width needs it), a GeLU MLP of 4 * width. ``arch`` names the family in a
    checkpoint's config."""

    vocab_size: int = 256
    width: int = 128
    num_layers: int = 4
    arch: str = "sdpa-transformer"

    def __post_init__(self):
        for name in ("vocab_size", "width", "num_layers"):
            positive_int(name, getattr(self, name))
        if self.width % 64:
            raise ValueError(f"width must be a multiple of 64 for a transformer, got {self.width}")
        if self.arch != "sdpa-transformer":
            raise ValueError(f"arch must be 'sdpa-transformer', got {self.arch!r}")

    @property
    def head_dim(self) -> int:
        return 128 if self.width % 128 == 0 else 64

    @classmethod
    def like(cls, config: LMConfig) -> "TransformerConfig":
        """The transformer of ``config``'s vocabulary, width and depth (parameters within 5% of it)."""
        return cls(vocab_size=config.vocab_size, width=config.width, num_layers=config.num_layers)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def num_params(self) -> int:
        """Parameter count of ``TransformerLM(self)`` (no biases; the tied head adds none)."""
        D = self.width
        return self.vocab_size * D + self.num_layers * (2 * D + 12 * D * D) + D


def model_config_from_dict(d: dict) -> "LMConfig | TransformerConfig":
    """An LMConfig, or a TransformerConfig where ``d`` names its ``arch``, from a JSON object."""
    if not isinstance(d, dict):
        raise ValueError(f"a model config must be a JSON object, got {type(d).__name__}")
    cls = TransformerConfig if "arch" in d else LMConfig
    unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ValueError(f"unknown model config field(s): {', '.join(unknown)}")
    return cls(**d)


MODEL_CONFIGS = (LMConfig, TransformerConfig)

PRESETS: dict[str, LMConfig] = {
    # Trains to well under 3 bits/byte on the embedded corpus in a few CPU minutes.
    "tiny": LMConfig(width=128, num_layers=4),
    "small": LMConfig(width=512, num_layers=8),
    "400m": LMConfig(width=1664, num_layers=12),
}
