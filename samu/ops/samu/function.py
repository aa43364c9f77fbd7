"""SAMU Triton variants: autograd, torch.library registration and dispatch entries."""
