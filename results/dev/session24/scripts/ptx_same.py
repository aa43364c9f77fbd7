"""Session 24: the per-layer decoding kernels (SAMU step at BN 1024, K 4; the three one-row product forms at the
400m shapes) compiled for sm_90 from a tree (argv[1]), their PTX written to /tmp/{rp<PRO>,st}_<argv[2]>.ptx; compare
two trees with: sed "/\\.section/,\$d" FILE | md5sum (the instructions, without the debug sections)."""
import sys, hashlib, re, triton
sys.path.insert(0, sys.argv[1])
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from samu.ops import step_triton as s, rowprod_triton as rp
from samu.ops.triton_utils import next_power_of_2
import inspect
def sig(fn, ptrs):
    out = {}
    for p in fn.params:
        if p.is_constexpr: out[p.name] = "constexpr"
        elif p.name in ("N", "sx", "K", "D"): out[p.name] = "i32"
        elif p.name in ("radial_bound", "eps"): out[p.name] = "fp32"
        else: out[p.name] = ptrs.get(p.name, "*fp32")
    return out
names = [p.name for p in s._samu_step.params]
wait = {"PDL": True} if "PDL" in names else {"WAIT": 1}
attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(s._samu_step.params) if not p.is_constexpr and p.name not in ("radial_bound",)}
k = triton.compile(ASTSource(s._samu_step, sig(s._samu_step, {"x": "*bf16", "y": "*bf16", "cw": "*bf16", "cb": "*bf16", "state": "*bf16"}), dict(BN=1024, K=4, **wait), attrs), target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
sass = re.sub(r"//.*", "", k.asm["ptx"])
sass = "\n".join(l for l in sass.splitlines() if not l.strip().startswith(".loc") and "$L__tmp" not in l and ".file" not in l)
print("samu_step ptx", hashlib.md5(sass.encode()).hexdigest(), len(sass)); open(f"/tmp/st_{sys.argv[2]}.ptx","w").write(sass)
names = [p.name for p in rp._row_product.params]
for pro, N, K in ((rp.PLAIN, 1664, 1664), (rp.GEGLU, 1664, 4992), (rp.NORM, 3328, 1664)):
    BN, BK = rp.tiles(N, K, pro)
    ce = dict(BN=BN, BK=BK, KP=next_power_of_2(K) if pro == rp.NORM else 1, PRO=pro, HAS_RES=True, **({"PDL": True} if "PDL" in names else {"WAIT": 1}))
    if pro != rp.NORM: ce["nw"] = None
    sg = sig(rp._row_product, {n: "*bf16" for n in ("w","b","x","res","nw","y")})
    if pro != rp.NORM: sg["nw"] = "constexpr"
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(rp._row_product.params) if sg[p.name] not in ("constexpr", "fp32")}
    k = triton.compile(ASTSource(rp._row_product, sg, ce, attrs), target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    t = re.sub(r"//.*", "", k.asm["ptx"]); t = "\n".join(l for l in t.splitlines() if not l.strip().startswith(".loc") and "$L__tmp" not in l and ".file" not in l)
    print("row_product", pro, hashlib.md5(t.encode()).hexdigest(), len(t)); open(f"/tmp/rp{pro}_{sys.argv[2]}.ptx","w").write(t)
