from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType

from samu.bench.timing import (Clock, count_launches, counterbalanced_order, launch_counts, median, peak_memory,
                               time_side_by_side)


def test_counterbalanced_order_reverses_every_other_round():
    assert counterbalanced_order(["a", "b", "c"]) == [["a", "b", "c"], ["c", "b", "a"]]
    assert counterbalanced_order(["a", "b"], rounds=4) == [["a", "b"], ["b", "a"], ["a", "b"], ["b", "a"]]


def test_median():
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5
    with pytest.raises(ValueError):
        median([])


def test_side_by_side_runs_warmups_then_samples_in_counterbalanced_order():
    calls = []
    fns = {name: (lambda name=name: calls.append(name)) for name in ("A", "B", "C")}
    fed = iter(float(v) for v in range(1, 31))
    timed = []

    def clock(fn):
        fn()
        timed.append(calls[-1])
        return next(fed)

    result = time_side_by_side(fns, clock)
    # each round: per candidate 3 warm-ups then 5 timed samples; round 2 in reverse order
    expected = []
    for order in (["A", "B", "C"], ["C", "B", "A"]):
        for name in order:
            expected += [name] * 8
    assert calls == expected
    assert timed == [n for order in (["A", "B", "C"], ["C", "B", "A"]) for n in order for _ in range(5)]
    # the clock's values arrive in that order: A gets 1..5 in round 1 and 26..30 in round 2
    assert result["A"].samples_ms == [[1.0, 2.0, 3.0, 4.0, 5.0], [26.0, 27.0, 28.0, 29.0, 30.0]]
    assert result["A"].round_medians_ms == [3.0, 28.0]
    assert result["A"].median_ms == 15.5
    assert result["C"].samples_ms == [[11.0, 12.0, 13.0, 14.0, 15.0], [16.0, 17.0, 18.0, 19.0, 20.0]]
    assert result["C"].median_ms == 15.5


@pytest.mark.parametrize("kw", [dict(warmup=2), dict(samples=4), dict(rounds=1)])
def test_side_by_side_refuses_less_than_the_spec_minimum(kw):
    with pytest.raises(ValueError, match="spec.md §8"):
        time_side_by_side({"a": lambda: None}, lambda fn: 1.0, **kw)


def test_cpu_clock_and_cuda_only_measures():
    clock = Clock("cpu")
    assert clock.describe()["method"] == "perf_counter"
    assert clock(lambda: torch.ones(10).sum()) >= 0.0
    assert peak_memory(lambda: None, "cpu") is None
    assert count_launches(lambda: None, "cpu") is None


def test_launch_counts_count_device_events_only():
    events = [SimpleNamespace(name=n, device_type=d) for n, d in [
        ("aten::mm", DeviceType.CPU), ("cudaLaunchKernel", DeviceType.CPU),
        ("_samu_fwd_kernel", DeviceType.CUDA), ("ampere_bf16_gemm", DeviceType.CUDA),
        ("Memcpy DtoD (Device -> Device)", DeviceType.CUDA), ("Memset (Device)", DeviceType.CUDA)]]
    assert launch_counts(events) == {"kernels": 2, "memcpy": 1, "memset": 1, "total": 4}
