import os
import tempfile

import torch

# Triton decides at decoration time whether kernels run in its CPU interpreter, so this must be
# set before any samu kernel module is imported: on a machine without CUDA every Triton kernel
# runs (slowly, exactly) in the interpreter on CPU tensors.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The tests never read or write the user's samu cache (corpus, gate status), and dispatch never
# starts a gate of its own unless a test asks for one: set before samu reads its status at import.
os.environ["SAMU_CACHE"] = tempfile.mkdtemp(prefix="samu-test-cache-")
os.environ["SAMU_AUTO_GATE"] = "0"
