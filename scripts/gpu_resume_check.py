"""Whether a resumed training run equals an uninterrupted one to the bit, on this machine's GPU.

For the SAMU LM and the transformer peer it runs the resume scenario of tests/test_train.py and
tests/models/test_transformer.py (6 steps whole; the same run stopped after 4 batches; that run resumed), all in
this one process, and prints which parameters differ. --mode says how determinism is set:

  none        TrainConfig(deterministic=False): no deterministic algorithms (samu train before 2026-12-02)
  inductor    as none, with torch._inductor.config.deterministic = True (Inductor's benchmarking off)
  algorithms  as none, with torch.use_deterministic_algorithms(True, warn_only=True) and a fixed cuBLAS workspace
              set here for the whole process
  flag-only   as algorithms without the cuBLAS workspace setting (that setting makes every product dear on the host:
              results/dev/issue10/determinism_4/): samu.train's own settings (_deterministic, the flag with its
              cuBLAS warning silenced) entered once for the whole process, the runs themselves without them
  narrow      as inductor, with the token embedding run outside the compiled graph (eager PyTorch's embedding
              gradient, which has no atomics; Inductor's is a scatter-add; patched here for the whole process),
              without the deterministic flag
  default     TrainConfig's defaults: samu train as it ships

results/dev/issue10/resume_check_1.txt holds calls of modes none (both --compile values), inductor and algorithms;
resume_check_2.txt of narrow, flag-only and default (samu train's default since e300d29: the flag alone).

Usage: python scripts/gpu_resume_check.py --mode MODE [--compile off,on]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    modes = ("none", "inductor", "algorithms", "flag-only", "narrow", "default")
    ap.add_argument("--mode", choices=modes, required=True)
    ap.add_argument("--compile", default="on", help="comma-separated: off, on")
    args = ap.parse_args()
    if args.mode == "algorithms":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    if args.mode == "flag-only":
        from samu.train import _deterministic

        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        _deterministic(True).__enter__()   # for the rest of the process, never left
    if args.mode in ("inductor", "narrow"):
        import torch._inductor.config as inductor_config

        inductor_config.deterministic = True
    if args.mode == "narrow":
        torch.nn.Embedding.forward = torch.compiler.disable(torch.nn.Embedding.forward)

    from samu.data import text_corpus
    from samu.train import train
    from tests.helpers import byte_text
    from tests.models.test_transformer import _config as transformer_config
    from tests.test_train import _config as lm_config
    from tests.test_train import _Interrupted, _StopAfter

    extra = {} if args.mode == "default" else {"deterministic": False}
    for name, make in (("samu-lm", lm_config), ("transformer", transformer_config)):
        for compile in args.compile.split(","):
            tmp = pathlib.Path(tempfile.mkdtemp())
            data = text_corpus(byte_text(tmp))
            whole = train(make(tmp, "whole", compile=compile, **extra), data=data)
            try:
                train(make(tmp, "parts", compile=compile, **extra), data=_StopAfter(data, 4))
            except _Interrupted:
                pass
            resumed = train(make(tmp, "parts", compile=compile, **extra), data=data, resume=True)
            differ = [n for (n, a), (_, b) in zip(whole.model.state_dict().items(), resumed.model.state_dict().items())
                      if not torch.equal(a, b)]
            losses = [(a["loss"], b["loss"]) for a, b in zip(whole.log["train"], resumed.log["train"])
                      if a["loss"] != b["loss"]]
            print(f"{name} compile={compile} mode={args.mode}: {'EXACT' if not differ else 'DIFFERS'} "
                  f"{len(differ)} of {len(whole.model.state_dict())} tensors, first {differ[:3]} "
                  f"first differing losses {losses[:2]}", flush=True)


if __name__ == "__main__":
    main()
