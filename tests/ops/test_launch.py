"""samu.ops.triton_utils.launch: the cached launch path, on a stand-in for a Triton kernel (no GPU needed).

A launch whose key (tensor dtypes and 16-byte alignment, every other argument's type and value, the
options, the device) was seen before calls the compiled kernel's launcher with every argument in
parameter order, tensors as their addresses; any other goes through Triton, and so does any launch with a
tensor that is not on a CUDA device. The CPU tensors of these tests pass for CUDA ones where the fixture
says so.
"""

import pytest
import torch

pytest.importorskip("triton")

from samu.ops import triton_utils  # noqa: E402


class _Compiled:
    """A compiled kernel whose launcher needs scratch memory: launched through its own call."""

    function, packed_metadata = "fn", "meta"

    def __init__(self, log):
        self.log = log

    def run(self, gx, gy, gz, stream, function, packed, metadata, enter, exit, *values):
        assert (function, packed, metadata, enter, exit) == ("fn", "meta", None, None, None)
        self.log.append(("direct", (gx, gy, gz), stream, values))


class _CLauncher:
    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid, launch_pdl = False, True

    def __init__(self, log):
        self.log = log

    def launch(self, gx, gy, gz, stream, function, coop, pdl, scratch, profile, packed, metadata, enter, exit, *values):
        assert (function, coop, pdl, scratch, profile, packed, metadata, enter, exit) == (
            "fn", False, True, None, None, "meta", None, None, None)
        self.log.append(("direct", (gx, gy, gz), stream, values))


class _CompiledNoScratch(_Compiled):
    """One that needs none: launched through its C launcher itself."""

    @property
    def run(self):
        return _CLauncher(self.log)


class _Kernel:
    """kernel[grid](*args, **kwargs) as Triton's JITFunction: parameter names, the Python function."""

    def __init__(self, compiled=_Compiled):
        self.log, self.compiled = [], compiled

        def fn(x, y, n, flag, eps=0.5, BLOCK=64):
            pass

        self.fn, self.arg_names = fn, ["x", "y", "n", "flag", "eps", "BLOCK"]

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.log.append(("triton", grid, args, kwargs))
            return self.compiled(self.log)
        return run


@pytest.fixture
def cached(monkeypatch):
    monkeypatch.setattr(triton_utils, "_INTERPRET", False)
    monkeypatch.setattr(triton_utils, "_CACHED_LAUNCH", True)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1234, raising=False)
    # the tests' CPU tensors stand for CUDA ones; a tensor on the meta device stands for one that is not
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: t.device.type != "meta"))


@pytest.mark.parametrize("compiled", [_Compiled, _CompiledNoScratch])
def test_a_seen_key_launches_directly_with_every_argument_in_order(cached, compiled):
    k = _Kernel(compiled)
    x, y = torch.zeros(8), torch.zeros(8)
    triton_utils.launch(k, (3,), x, y, 16, flag=True, BLOCK=32, num_warps=4)
    triton_utils.launch(k, (5, 2), x, y, 16, flag=True, BLOCK=32, num_warps=4)
    assert [e[0] for e in k.log] == ["triton", "direct"]
    assert k.log[1][1:] == ((5, 2, 1), 1234, (x.data_ptr(), y.data_ptr(), 16, True, 0.5, 32))   # eps: its default


def test_a_tensor_off_cuda_goes_through_triton_even_with_a_seen_key(cached):
    k = _Kernel()
    x = torch.zeros(8)
    triton_utils.launch(k, (1,), x, x, 16, flag=True)
    triton_utils.launch(k, (1,), x, x, 16, flag=True)
    off = torch.zeros(8, device="meta")
    triton_utils.launch(k, (1,), off, x, 16, flag=True)
    triton_utils.launch(k, (1,), x, off, 16, flag=True)
    assert [e[0] for e in k.log] == ["triton", "direct", "triton", "triton"]
    assert k.log[2][2][0] is off and k.log[3][2][1] is off   # Triton gets the tensors themselves


def test_every_key_change_goes_through_triton(cached):
    k = _Kernel()
    x, y = torch.zeros(8), torch.zeros(8)
    base = dict(flag=True, BLOCK=32, num_warps=4)
    triton_utils.launch(k, (1,), x, y, 16, **base)
    triton_utils.launch(k, (1,), x, y, 17, **base)                               # an int's value
    triton_utils.launch(k, (1,), x.double(), y, 16, **base)                      # a dtype
    triton_utils.launch(k, (1,), torch.zeros(9)[1:], y, 16, **base)              # 4-byte alignment
    triton_utils.launch(k, (1,), x, y, 16, **dict(base, flag=1))                 # True and 1
    triton_utils.launch(k, (1,), x, y, 16, **dict(base, num_warps=8))            # an option
    triton_utils.launch(k, (1,), x, y, 16, **dict(base, BLOCK=64))               # a constexpr
    triton_utils.launch(k, (1,), x, y, 16, eps=0.25, **base)                     # a float's value
    assert [e[0] for e in k.log] == ["triton"] * 8
    triton_utils.launch(k, (1,), torch.ones(8), y, 17, **base)                   # other data, a seen key
    assert k.log[-1][0] == "direct"


def test_the_interpreter_and_the_switch_always_go_through_triton(monkeypatch):
    k = _Kernel()
    x = torch.zeros(8)
    for interpret, cached_launch in ((True, True), (False, False)):
        monkeypatch.setattr(triton_utils, "_INTERPRET", interpret)
        monkeypatch.setattr(triton_utils, "_CACHED_LAUNCH", cached_launch)
        for _ in range(2):
            triton_utils.launch(k, (1,), x, x, 16, flag=False)
    assert [e[0] for e in k.log] == ["triton"] * 4


def test_the_cache_holds_no_tensor_and_starts_over_when_full(cached, monkeypatch):
    import gc
    import weakref

    k = _Kernel()
    x = torch.zeros(8)
    ref = weakref.ref(x)
    triton_utils.launch(k, (1,), x, x, 16, flag=True)
    k.log.clear()   # the stand-in's own log of its calls
    del x
    gc.collect()
    assert ref() is None   # the key keeps a tensor's dtype and alignment only
    monkeypatch.setattr(triton_utils, "_MAX_ENTRIES", 3)
    y = torch.zeros(8)
    for n in range(5):
        triton_utils.launch(k, (1,), y, y, n, flag=True)
    # cleared when full (keys 16, 0, 1), then filled again with 2, 3, 4
    assert sorted(key[2][1] for key in k._samu_launch[-1]) == [2, 3, 4]
    # a tuple argument would keep its tensors in the key: never cached
    for _ in range(2):
        triton_utils.launch(k, (1,), y, (y, y), 16, flag=True)
    assert k.log[-1][0] == "triton" and k.log[-2][0] == "triton"
