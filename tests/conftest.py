import os

import torch

# Triton decides at decoration time whether kernels run in its CPU interpreter, so this must be
# set before any samu kernel module is imported: on a machine without CUDA every Triton kernel
# runs (slowly, exactly) in the interpreter on CPU tensors.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
