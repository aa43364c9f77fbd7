"""The one measurement path every scope uses (spec §8): counterbalanced timing, memory, launches."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

WARMUP = 3
SAMPLES = 5
ROUNDS = 2
# Larger than the H200's L2 (about 60 MB), so every sample starts from DRAM.
L2_FLUSH_BYTES = 256 << 20


def counterbalanced_order(names: list[str], rounds: int = ROUNDS) -> list[list[str]]:
    """Even rounds run the candidates A B …, odd rounds … B A."""
    names = list(names)
    return [names if r % 2 == 0 else names[::-1] for r in range(rounds)]


def median(values) -> float:
    values = list(values)
    if not values:
        raise ValueError("median of no values")
    return float(statistics.median(values))


class Clock:
    """Times one call in milliseconds: CUDA events on a GPU, the host clock elsewhere.

    On a GPU each sample starts from an idle device with a flushed L2 (both untimed), so a sample
    is the latency of one call including any host work the device waits for.
    """

    def __init__(self, device, flush_bytes: int = L2_FLUSH_BYTES):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.flush_bytes = flush_bytes if self.cuda else 0
        self._flush = torch.empty(flush_bytes, dtype=torch.uint8, device=self.device) if self.flush_bytes else None

    def describe(self) -> dict:
        return {"method": "cuda_events" if self.cuda else "perf_counter",
                "l2_flush_bytes": self.flush_bytes,
                "synchronize_before_sample": self.cuda}

    def __call__(self, fn: Callable) -> float:
        if not self.cuda:
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3
        if self._flush is not None:
            self._flush.zero_()
        torch.cuda.synchronize(self.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)


@dataclass
class Timing:
    median_ms: float
    round_medians_ms: list[float]
    samples_ms: list[list[float]]   # one list per round


def time_side_by_side(fns: dict[str, Callable], clock: Callable[[Callable], float], *, warmup: int = WARMUP,
                      samples: int = SAMPLES, rounds: int = ROUNDS) -> dict[str, Timing]:
    """Time every candidate in counterbalanced rounds; each round warms a candidate up, then samples it."""
    if warmup < WARMUP or samples < SAMPLES or rounds < ROUNDS:
        raise ValueError(f"docs/spec.md §8 needs >= {WARMUP} warm-ups, >= {SAMPLES} samples and >= {ROUNDS} rounds; "
                         f"got warmup={warmup}, samples={samples}, rounds={rounds}")
    per_round: dict[str, list[list[float]]] = {name: [] for name in fns}
    for order in counterbalanced_order(list(fns), rounds):
        for name in order:
            fn = fns[name]
            for _ in range(warmup):
                fn()
            per_round[name].append([clock(fn) for _ in range(samples)])
    return {name: Timing(median(t for r in rs for t in r), [median(r) for r in rs], rs)
            for name, rs in per_round.items()}


def peak_memory(fn: Callable, device) -> "dict | None":
    """Peak allocated and reserved bytes above the level before one call (CUDA only)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    alloc, reserved = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
    fn()
    torch.cuda.synchronize(device)
    return {"peak_alloc": torch.cuda.max_memory_allocated(device) - alloc,
            "peak_reserved": torch.cuda.max_memory_reserved(device) - reserved}


def count_launches(fn: Callable, device) -> "dict | None":
    """Device activities of one call from torch.profiler: kernels, memcpys and memsets (CUDA only)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize(device)
    return launch_counts(prof.events())


def launch_counts(events) -> dict:
    """Count the CUDA-side profiler events by kind; host-side events (ops, runtime calls) are not launches."""
    from torch.autograd import DeviceType

    counts = {"kernels": 0, "memcpy": 0, "memset": 0}
    for event in events:
        if event.device_type != DeviceType.CUDA:
            continue
        name = event.name.lower()
        counts["memcpy" if name.startswith("memcpy") else "memset" if name.startswith("memset") else "kernels"] += 1
    counts["total"] = counts["kernels"] + counts["memcpy"] + counts["memset"]
    return counts


def copy_bandwidth(device, clock: "Clock | None" = None, nbytes: "int | None" = None) -> dict:
    """Device-to-device copy bandwidth (bytes read + written per second), timed like every scope."""
    device = torch.device(device)
    clock = clock or Clock(device)
    nbytes = nbytes or ((1 << 30) if device.type == "cuda" else (64 << 20))
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    timing = time_side_by_side({"copy": lambda: dst.copy_(src)}, clock)["copy"]
    return {"bytes": nbytes, "median_ms": timing.median_ms,
            "bytes_per_s": 2 * nbytes / (timing.median_ms * 1e-3)}
