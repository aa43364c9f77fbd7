"""SAMU variants that fault at L = 33, for the gate runner's worker test: ``run_gates(...,
preload=["tests.gates.faulty_variants"])`` has the spawned worker import this module, which registers
them there (a variant registered by monkeypatching the parent would not exist in the child).

* ``test_gate_exit`` takes its process down (``os._exit(3)``), as a segfault would;
* ``test_gate_sticky`` raises CUDA's illegal-address error and the worker's context probe then fails,
  as after a real fault on a GPU (every later CUDA call of that process raises);
* ``test_gate_fine`` is the torch path. At other lengths all three are the torch path.
"""

import os

from samu.gates import runner
from samu.ops import dispatch
from samu.ops.samu.torch import samu_mixer_torch

FAULT_L = 33
ILLEGAL_ADDRESS = "CUDA error: an illegal memory access was encountered"
_faulted: list = []


def _fine(x, *args):
    return samu_mixer_torch(x, *args)


def _exit(x, *args):
    if x.shape[1] == FAULT_L:
        os._exit(3)
    return _fine(x, *args)


def _sticky(x, *args):
    if x.shape[1] == FAULT_L:
        _faulted.append(True)
        raise RuntimeError(ILLEGAL_ADDRESS)
    return _fine(x, *args)


def _context_lost(device):
    return f"RuntimeError: {ILLEGAL_ADDRESS}" if _faulted else None


runner._context_lost = _context_lost
for name, run, score in (("test_gate_exit", _exit, -3e9), ("test_gate_sticky", _sticky, -2.5e9),
                         ("test_gate_fine", _fine, -2e9)):
    dispatch.register(dispatch.Variant("samu", name, run, lambda B, L, D, H, s=score: s,
                                       lambda B, L, D: ("0", 0), "test dummy"))
