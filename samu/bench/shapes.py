"""Named shape sets (spec §8) and the ``--shapes`` syntax: set names or literal ``BxLxD``."""

from __future__ import annotations

PRIMARY = ((4, 2048, 2048), (2, 4096, 2560), (1, 32768, 1024), (1, 32768, 2048), (1, 8192, 1024))
LENGTH = tuple((1, L, 1024) for L in (8192, 16384, 32768, 65536, 131072))
WIDTH = tuple((1, 32768, D) for D in (1024, 1536, 2048, 2560))
# Block and optimizer-step scopes cover every mixer shape, plus one block of the 400m preset (width 1664).
BLOCK = tuple(dict.fromkeys(PRIMARY + LENGTH + WIDTH + ((4, 2048, 1664),)))
# Full-model training steps of the 400m preset: 8192 tokens as 4 x 2048 and as one 8192-token sequence.
STEP = ((4, 2048, 1664), (1, 8192, 1664))

# Generation with the 400m preset: L = 64 greedy decoding steps per timed call at batch 1, 8 and 64.
GEN = ((1, 64, 1664), (8, 64, 1664), (64, 64, 1664))
# Tokens of the prompt whose state the gen scope decodes from: its prefill is a sequence kernel call.
GEN_PROMPT = 16
GEN_PREFILL = tuple(dict.fromkeys((B, GEN_PROMPT, D) for B, _, D in GEN))
# The prefill scope: 512-token prompts at the gen batches, and one 32K-token prompt.
PREFILL = ((1, 512, 1664), (8, 512, 1664), (64, 512, 1664), (1, 32768, 1664))

# The packed scope: one row of 32K tokens at two widths, packed into 16 and into 256 sequences.
PACKED = ((1, 32768, 2048), (1, 32768, 1024))

# The mixer shapes of the presets' default training runs (batch 16 of 256 tokens: tiny, small, 400m)
# and of models of width 2048 at 8K and 64K tokens (the compile checks), so a fresh install's `auto`
# finds them gated.
TRAIN = ((16, 256, 128), (16, 256, 512), (16, 256, 1664), (1, 8192, 2048), (1, 65536, 2048))

SETS = {"primary": PRIMARY, "length": LENGTH, "width": WIDTH, "block": BLOCK, "step": STEP, "gen": GEN,
        "prefill": PREFILL, "packed": PACKED, "train": TRAIN}
# Every shape a sequence kernel is benchmarked at (a gate speaks only for the numerics of its shape),
# the generation prompts' prefill, the prefill scope's and the training shapes above.
GATE = tuple(dict.fromkeys(PRIMARY + LENGTH + WIDTH + BLOCK + STEP + GEN_PREFILL + PREFILL + TRAIN))
SETS["gate"] = GATE


def parse_shapes(spec: str) -> list[tuple[int, int, int]]:
    """``"primary,1x64x32"`` -> unique (B, L, D) tuples in first-seen order; ``-name`` (a set or a
    shape) removes, e.g. ``"length,width,-primary"``."""
    shapes: list[tuple[int, int, int]] = []
    removed: set = set()
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        drop = item.startswith("-")
        name = item[1:] if drop else item
        if name in SETS:
            new = list(SETS[name])
        else:
            parts = name.lower().split("x")
            if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
                names = ", ".join(sorted(SETS))
                raise ValueError(f"shape {item!r} is neither a set name ({names}) nor BxLxD with positive integers")
            new = [tuple(int(p) for p in parts)]
        if drop:
            removed.update(new)
            continue
        for shape in new:
            if shape not in shapes:
                shapes.append(shape)
    shapes = [s for s in shapes if s not in removed]
    if not shapes:
        raise ValueError(f"no shapes in {spec!r}")
    return shapes


def shape_sets(shape) -> list[str]:
    """The named sets a shape belongs to (the report groups rows by these)."""
    return [name for name, members in SETS.items() if tuple(shape) in members]


def shape_str(shape) -> str:
    return "x".join(str(s) for s in shape)
