"""Small helpers shared by every samu kernel: ``launch`` (each kernel's launches, cached), ``carve`` (a pass's
scratch in one allocation), @triton.jit device functions, and two host integer helpers (``triton.cdiv`` and
``triton.next_power_of_2`` are constexpr functions that cost several microseconds a call on the host; a forward +
backward calls them a dozen times)."""

import inspect
import os

import torch
import triton
import triton.language as tl


_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
# Cached launches (``launch``): SAMU_TRITON_LAUNCH=jit launches every kernel through Triton's own path.
_CACHED_LAUNCH = os.environ.get("SAMU_TRITON_LAUNCH", "cached") != "jit"
_MAX_ENTRIES = 256     # per kernel: distinct argument keys (shapes) before its cache starts over


def _launcher(compiled):
    """(call, prefix) launching ``compiled`` as call(grid x, y, z, stream, *prefix, *arguments): its C
    launcher itself where the kernel needs no scratch memory (Triton's CudaLauncher, else its own call)."""
    run = compiled.run   # loads the module on first use
    fixed = (compiled.function, compiled.packed_metadata, None, None, None)
    if getattr(run, "global_scratch_size", 1) == 0 and getattr(run, "profile_scratch_size", 1) == 0:
        return run.launch, (compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None, *fixed[1:])
    return run, fixed


def launch(kernel, grid, *args, **kwargs):
    """``kernel[grid](*args, **kwargs)`` at a fraction of Triton's host cost per launch.

    The first launch with a given key (each tensor's dtype and 16-byte alignment, every other argument's
    type and exact value, the options, the device) goes through Triton, which compiles or finds the
    kernel and checks every pointer; later ones call that kernel's launcher directly with each tensor's
    address, skipping Triton's per-launch binding, cache-key and hook work (Triton's launch hooks, used by
    its profilers, see only the first) and the driver query its launcher makes for every tensor. A tensor
    not on a CUDA device always goes through Triton (which refuses it). In the interpreter, and with
    SAMU_TRITON_LAUNCH=jit, every launch goes through Triton.
    """
    if _INTERPRET or not _CACHED_LAUNCH:
        return kernel[grid](*args, **kwargs)
    entry = kernel.__dict__.get("_samu_launch")
    if entry is None:
        defaults = {n: p.default for n, p in inspect.signature(kernel.fn).parameters.items()
                    if p.default is not inspect.Parameter.empty}
        entry = kernel._samu_launch = (kernel.arg_names, frozenset(kernel.arg_names), defaults, {})
    names, named, defaults, cache = entry
    values = (*args, *[kwargs[n] if n in kwargs else defaults[n] for n in names[len(args):]])
    # everything Triton specialises a launch on: a tensor's dtype and 16-byte alignment; for any other
    # argument (ints, floats, constexprs, flags) its type and value, stricter than Triton's own classes
    # (the type too: True and 1 compile differently); then the options (num_warps, ...) and the device
    key = []
    call = []
    for a in values:
        if isinstance(a, torch.Tensor):
            if not a.is_cuda:
                return kernel[grid](*args, **kwargs)
            p = a.data_ptr()
            key.append((a.dtype, p % 16 == 0))
            call.append(p)
        else:
            key.append((type(a), a))
            call.append(a)
    for k, v in kwargs.items():
        if k not in named:
            key.append((k, (type(v), v)))
    device = torch._C._cuda_getDevice()
    key.append(device)
    key = tuple(key)
    hit = cache.get(key)
    if hit is None:
        compiled = kernel[grid](*args, **kwargs)
        # a tuple or list argument would hold its tensors in the key: such launches are not cached
        if not any(isinstance(a, (tuple, list)) for a in (*args, *kwargs.values())):
            if len(cache) >= _MAX_ENTRIES:
                cache.clear()
            cache[key] = _launcher(compiled)
        return compiled
    run, prefix = hit
    g = (*grid, 1, 1)
    run(g[0], g[1], g[2], torch._C._cuda_getCurrentRawStream(device), *prefix, *call)


_PDL = {}   # (device type, index) -> whether programmatic dependent launch is there (asked once a device)


def pdl(device: torch.device) -> dict:
    """Launch options for programmatic dependent launch on ``device``: ``{"launch_pdl": True}`` where it exists
    (CUDA sm_90 and later, a Triton with ``gdc_wait``; not ROCm, not the interpreter), else none. A kernel
    launched so may start while the one before it runs: it must call ``triton.language.extra.cuda.gdc_wait()``
    before it reads anything that kernel may have written (a no-op when launched without), so it may read
    before the wait only tensors that no kernel just before it writes, and may call ``gdc_launch_dependents()``
    to let the next one start."""
    key = (device.type, device.index)
    if key not in _PDL:
        from triton.language.extra import cuda as tlc

        _PDL[key] = (not _INTERPRET and device.type == "cuda" and torch.version.hip is None
                     and hasattr(tlc, "gdc_wait") and torch.cuda.get_device_capability(device)[0] >= 9)
    return {"launch_pdl": True} if _PDL[key] else {}


_layouts: dict = {}   # carve's shapes -> (words, [(shape, strides, start)])


def carve(empty, device, *shapes) -> list:
    """Contiguous fp32 views of ``shapes`` cut from one buffer of ``empty`` (torch.empty's signature), each from a
    512-byte boundary as a buffer of its own would start: a pass's scratch in one allocation (an allocation costs an
    eager call ~3 us of host time on CUDA, a view half that)."""
    layout = _layouts.get(shapes)
    if layout is None:
        views, total = [], 0
        for shape in shapes:
            strides, n = [], 1
            for s in reversed(shape):
                strides.append(n)
                n *= s
            views.append((shape, strides[::-1], total))
            total += -(-n // 128) * 128
        if len(_layouts) > 4096:
            _layouts.clear()
        layout = _layouts[shapes] = (total, views)
    buf = empty(layout[0], device=device, dtype=torch.float32)
    return [buf.as_strided(shape, strides, start) for shape, strides, start in layout[1]]


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive integers (host code)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n, for n >= 1 (host code)."""
    return 1 << (n - 1).bit_length()


@triton.jit
def expm1(x):
    """exp(x) - 1 to a few ulp (the Triton interpreter has no libdevice).

    Near 0, Kahan's (u - 1) x / log(u) with u = exp(x) cancels the rounding of u; elsewhere u - 1
    has no cancellation.
    """
    u = tl.exp(x)
    near = (tl.abs(x) < 0.5) & (u != 1.0)
    safe = tl.where(near, u, 2.0)
    kahan = (safe - 1.0) * x / tl.log(safe)
    return tl.where(near, kahan, tl.where(u == 1.0, x, u - 1.0))


@triton.jit
def one_minus_exp_neg_small(x):
    """1 - exp(-x) for 0 <= x < 0.5 by its Taylor polynomial (where 1 - exp(-x) would cancel)."""
    p = 1.0 / 362880.0
    p = p * x - 1.0 / 40320.0
    p = p * x + 1.0 / 5040.0
    p = p * x - 1.0 / 720.0
    p = p * x + 1.0 / 120.0
    p = p * x - 1.0 / 24.0
    p = p * x + 1.0 / 6.0
    p = p * x - 0.5
    p = p * x + 1.0
    return p * x


@triton.jit
def one_minus_exp_neg(x):
    """1 - exp(-x) for x >= 0, to ~2 ulp."""
    return tl.where(x < 0.5, one_minus_exp_neg_small(x), 1.0 - tl.exp(-x))


@triton.jit
def tanh(x):
    """tanh from one_minus_exp_neg: accurate near 0 and saturating cleanly."""
    e = one_minus_exp_neg(2.0 * tl.abs(x))
    t = e / (2.0 - e)
    return tl.where(x < 0, -t, t)


_SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)
_GELU_CUBIC = tl.constexpr(0.044715)


@triton.jit
def _gelu_parts(v):
    """(s, t, du, gone) with u = sqrt(2/pi) (v + 0.044715 v^3): s = sigmoid(2u) = (1 + tanh u) / 2,
    t = s (1 - s) = e s^2 with e = exp(-2u), du = d(2u)/dv, and ``gone`` where -2u > 80 (GeLU and its
    slope are 0 there to fp32 precision; e is capped so that nothing overflows on the way)."""
    u = _SQRT_2_OVER_PI * (v + _GELU_CUBIC * v * v * v)
    gone = -2.0 * u > 80.0
    e = tl.exp(tl.minimum(-2.0 * u, 80.0))
    s = 1.0 / (1.0 + e)
    du = 2.0 * _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_CUBIC * v * v)
    return s, e * s * s, du, gone


@triton.jit
def gelu_tanh(v):
    """GeLU, tanh approximation (PyTorch's approximate="tanh"), in fp32: 0.5 v (1 + tanh u) written as
    v sigmoid(2u), which has no cancellation where tanh u is near -1 (v below about -3)."""
    s, _, _, gone = _gelu_parts(v)
    return tl.where(gone, 0.0, v * s)


@triton.jit
def gelu_tanh_grad(v):
    """d gelu_tanh(v) / dv = s + v s (1 - s) d(2u)/dv; the second term is left out where s (1 - s) is 0,
    so that a huge v (whose du overflows) gives 1, not inf * 0."""
    s, t, du, gone = _gelu_parts(v)
    return tl.where(gone, 0.0, s + tl.where(t == 0.0, 0.0, v * t * du))


# Triton's interpreter truncates fp32 -> bf16 (the GPU rounds to nearest even); kernels run in the
# interpreter exactly when this is set at import, as Triton decides that when it decorates them.
_INTERPRETED = tl.constexpr(_INTERPRET)


@triton.jit
def cast_to(x, dtype: tl.constexpr):
    """x (fp32) to the storage dtype, rounding to nearest even (by hand in the interpreter)."""
    if _INTERPRETED and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + (((bits >> 16) & 1) + 0x7FFF)
        rounded = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        return tl.where(x == x, rounded, x.to(tl.bfloat16))
    else:
        return x.to(dtype)


@triton.jit
def gelu_gate(gate, up, dtype: tl.constexpr):
    """GeLU_tanh(gate) * up (fp32 in, fp32 out) rounded to ``dtype`` where the unfused ops round: GeLU's output,
    then the product (the GeGLU kernel, the block step's gate, the down product's prologue)."""
    g = cast_to(gelu_tanh(gate), dtype).to(tl.float32)
    return cast_to(g * up, dtype).to(tl.float32)


@triton.jit
def inv_rms(v, n, eps):
    """1 / sqrt(mean(v^2) + eps) over the n entries of the row v (fp32; entries past n are zero): RMSNorm's
    scale, as its kernel and the normed one-row products compute it."""
    return 1.0 / tl.sqrt(tl.sum(v * v, axis=0) / n + eps)


@triton.jit
def prefetch_l2(p):
    """Ask the L2 cache for the lines at pointers ``p`` (any shape) ahead of the loads that will read them: no
    register waits for the line and no value changes (PTX ``prefetch.global.L2``, NVIDIA GPUs only, as
    dispatch.triton_unusable says; nothing in the interpreter)."""
    if not _INTERPRETED:
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [p], dtype=tl.int32,
                                  is_pure=False, pack=1)


@triton.jit
def exp_flushed(x):
    """exp(x) as tl.exp computes it on NVIDIA GPUs (ex2.approx of x log2 e, the same instruction and the same
    fp32 factor), with results below 2^-126 flushed to zero: the flushing form (``.ftz``) is one instruction
    where the other is four (ptxas's rescaling around it for subnormal results). The interpreter takes tl.exp."""
    if _INTERPRETED:
        return tl.exp(x)
    else:
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x * 1.4426950408889634],
                                         dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def fence_gpu():
    """A GPU-scope acquire-release fence by every thread of the program (PTX ``fence.acq_rel.gpu``): its stores
    before are seen by any program that synchronises with it afterwards, and its loads after see the stores of any
    program it synchronised with. Nothing in the interpreter, whose programs run one after another."""
    if not _INTERPRETED:
        tl.inline_asm_elementwise("fence.acq_rel.gpu;\n\tmov.u32 $0, 0;", "=r,r", [tl.zeros([1], dtype=tl.int32)],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def arrive(count, members):
    """Count this program in at the int32 counter ``count``, shared by ``members`` programs of one launch: true
    for the last of them to arrive, which then sees every store the others made before they arrived (each
    program's stores are fenced, then all its threads meet, then one thread adds to the counter with acquire-
    release semantics; the adder's read is fenced again). Deterministic where the last arrival's work is: it
    does the same work whichever program arrives last. The counter must be zero when the first arrives; the last
    arrival stores it back to zero once done with it (``tl.store(count, 0)``), so the next launch finds it so."""
    fence_gpu()
    tl.debug_barrier()
    seen = tl.atomic_add(count, 1, sem="acq_rel", scope="gpu")
    fence_gpu()
    return seen == members - 1


# how a program waits for the work its input comes from (rowprod_triton._row_product's and step_triton._samu_step's
# WAIT): not at all, or programmatic dependent launch's gdc_wait (``pdl``)
NO_WAIT, PDL_WAIT = 0, 1
_PDL_WAIT = tl.constexpr(PDL_WAIT)
