"""RG-LRU Triton variants: autograd, torch.library registration and dispatch entries."""
