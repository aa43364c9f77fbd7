"""Session 19's offline probes of RG-LRU's packed backward (no GPU): each a text edit of `_chunk_cotangents` in
samu/ops/rglru/triton_bwd.py of a tree taken from d61add3 (the code before the adjoint scan moved first), compiled
for sm_90 by scripts/offline_regs.py (registers and spilled words of every launch, unpacked and packed into 16).

Usage: python offline_probes.py BASE OUTDIR   (BASE: `git archive d61add3 samu tests scripts | tar -x -C BASE`)
Writes OUTDIR/NAME.json per probe. Probes "before_only" and "adjoint_only" are not correct code (one scan without
the cut): they measure what holding the cut transitions through both scans costs.
"""
import os
import shutil
import subprocess
import sys

BEFORE = """    # g_t = a_t h_{t-1}, from the state entering the chunk"""
ADJOINT = """    # delta_t = dy_t + a_{t+1} delta_{t+1}"""
POINTWISE = """    # pointwise cotangents; b = multiplier"""
SIGN_RESTART = """        b_as, b_bs = _restart(b_at, b_bt, opens, b_h0, HAS_H0)
"""


def swap_scans(s):
    """The adjoint scan before the forward one (b3d4a89's order)."""
    a0, a1, a2 = s.index(BEFORE), s.index(ADJOINT), s.index(POINTWISE)
    return s[:a0] + s[a1:a2] + s[a0:a1] + s[a2:]


def sign(s):
    """a and the cut in one tile: -a where a sequence opens; the scans take max(., 0) and a select, |.| after."""
    s = s.replace(SIGN_RESTART, """        _, b_bs = _restart(b_at, b_bt, opens, b_h0, HAS_H0)
        b_at = tl.where(opens[None, :, :], -b_at, b_at)
        b_as = tl.maximum(b_at, 0.0)
""")
    s = s.replace("""        if HAS_H0:
            b_gt = tl.where(opens[None, :, :], b_at * b_h0, b_gt)
        else:
            b_gt = tl.where(opens[None, :, :], 0.0, b_gt)
""", """        cut = b_at < 0.0
        if HAS_H0:
            b_gt = tl.where(cut, -b_at * b_h0, b_gt)
        else:
            b_gt = tl.where(cut, 0.0, b_gt)
        b_as = tl.where(cut, 0.0, b_at)
        b_at = tl.abs(b_at)
""")
    return s


PROBES = {
    "d61add3": lambda s: s,
    "before_only": lambda s: s.replace("_scan_adjoint(_flip_tokens(b_as, K, MATH)", "_scan_adjoint(_flip_tokens(b_at, K, MATH)"),
    "adjoint_only": lambda s: s.replace("_scan_before(b_as, b_bs, K, MATH)", "_scan_before(b_at, b_bs, K, MATH)"),
    "adjoint_first": swap_scans,
    "sign": sign,
}


def main():
    base, out = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    os.makedirs(out, exist_ok=True)
    for name, edit in PROBES.items():
        tree = f"{base}_{name}"
        shutil.rmtree(tree, ignore_errors=True)
        shutil.copytree(base, tree)
        path = os.path.join(tree, "samu/ops/rglru/triton_bwd.py")
        text = open(path).read()
        changed = edit(text)
        assert (changed != text) == (name != "d61add3"), f"probe {name} did not apply"
        open(path, "w").write(changed)
        subprocess.run([sys.executable, os.path.join(tree, "scripts/offline_regs.py"), "--ops", "rglru", "--shape",
                        "1,4096,2048", "--documents", "0,16", "--variants", "triton_chunked", "--json",
                        os.path.join(out, f"{name}.json")], check=True, env=dict(os.environ, PYTHONPATH=tree),
                       stdout=subprocess.DEVNULL)
        rows = __import__("json").load(open(os.path.join(out, f"{name}.json")))["rows"]
        print(name, " ".join(f"{r['kernel'][7:]}[docs={r['documents']}]={r['spills']}" for r in rows
                             if r["kernel"] in ("_rglru_bwd_dw_kernel", "_rglru_bwd_dx_kernel")))


if __name__ == "__main__":
    main()
