"""One rank of tests/ops/test_sequence_parallel.py, run under torchrun with gloo on the CPU.

    python -m torch.distributed.run --standalone --nproc-per-node N tests/ops/sequence_parallel_worker.py
        --out DIR --lengths L_0,...,L_{N-1} [--dtype float32]

Every rank draws the whole sequence's inputs from the same seeds, takes its shard (lengths in rank order),
runs both mixers' sequence-parallel forward and backward (the final state's cotangent on the last rank
only: it is one output, replicated) and saves its outputs and gradients to DIR/<op>-<rank>.pt; where every
shard holds at least 3 tokens (the Conv1D's reach), also a 2-layer language model of each mixer split the
same way (DIR/lm-<mixer>-<rank>.pt: its logits and every parameter's gradient).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

from samu.ops.sequence_parallel import rglru_mixer_sequence_parallel, samu_mixer_sequence_parallel
from tests.helpers import randn, rglru_params, samu_params

B, D, H = 2, 16, 4


def inputs(op: str, L: int, dtype):
    """The whole sequence's x, parameters, initial state and cotangents (of y and of the final state)."""
    params = samu_params(D, 3) if op == "samu" else rglru_params(D, H, 3)
    x = randn((B, L, D), 1, dtype=dtype)
    h0 = randn((B, D), 2)
    dy = randn((B, L, D), 4, dtype=dtype, requires_grad=False)
    dh = randn((B, D), 5, requires_grad=False)
    return x, [p.detach().requires_grad_() for p in params], h0, dy, dh


def lm_inputs(mixer: str, L: int, group=None):
    """A 2-layer LM (the same weights wherever it is built), tokens [B, L] and the logits' cotangent."""
    from samu.models import LanguageModel, LMConfig

    torch.manual_seed(7)
    model = LanguageModel(LMConfig(vocab_size=11, width=16, num_layers=2, mixer=mixer, num_heads=2),
                          backend="torch", sequence_parallel=group)
    g = torch.Generator().manual_seed(8)
    return model, torch.randint(0, 11, (B, L), generator=g), torch.randn(B, L, 11, generator=g)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--lengths", required=True)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    lengths = [int(v) for v in args.lengths.split(",")]
    assert len(lengths) == world, (lengths, world)
    start = sum(lengths[:rank])
    stop = start + lengths[rank]
    dtype = getattr(torch, args.dtype)
    for op, fn in (("samu", samu_mixer_sequence_parallel), ("rglru", rglru_mixer_sequence_parallel)):
        x, params, h0, dy, dh = inputs(op, sum(lengths), dtype)
        shard = x.detach()[:, start:stop].clone().requires_grad_()
        y, h = fn(shard, *params, initial_state=h0, output_final_state=True, backend="torch")
        loss = (y.float() * dy[:, start:stop].float()).sum() + ((h * dh).sum() if rank == world - 1 else 0.0)
        grads = torch.autograd.grad(loss, [shard, h0, *params])
        torch.save({"y": y.detach(), "h": h.detach(), "grads": [g.detach() for g in grads]},
                   f"{args.out}/{op}-{rank}.pt")
    if min(lengths) >= 3:
        for mixer in ("samu", "rglru"):
            model, tokens, cot = lm_inputs(mixer, sum(lengths), dist.group.WORLD)
            logits, _ = model(tokens[:, start:stop])
            grads = torch.autograd.grad((logits * cot[:, start:stop]).sum(), list(model.parameters()))
            torch.save({"logits": logits.detach(), "grads": [g.detach() for g in grads]},
                       f"{args.out}/lm-{mixer}-{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
