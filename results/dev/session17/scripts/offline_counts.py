"""Session 17 (issue 15), no GPU: the RG-LRU kernels of one tree compiled for sm_90 (tests/sm90.py) at
(1, 4096, 2048), unpacked and packed into 16 sequences, without states (training's form), fast variant: per kernel
its registers and spills, its SASS instruction counts by opcode, and in its Triton GPU IR the layout conversions and
the exp2 / libdevice calls. Usage: python offline_counts.py ROOT OUT.json (ROOT: a tree with samu, tests, scripts)."""
import collections
import json
import re
import sys

root, out = sys.argv[1], sys.argv[2]
sys.path.insert(0, root)
sys.path.insert(0, root + "/scripts")
import torch  # noqa: E402

import tests.sm90 as sm90  # noqa: E402
from sass_same import Dumper  # noqa: E402

assert sm90.__file__.startswith(root), sm90.__file__


class Counter(Dumper):
    def record(self, kernel, constexprs, options, compiled):
        sass = super().record(kernel, constexprs, options, compiled)
        ops = collections.Counter((s.split()[1] if s.startswith("@") else s.split()[0]).split(".")[0] for s in sass)
        usage = sm90._usage(compiled.asm["cubin"])
        ttgir = compiled.asm["ttgir"]
        flags = {kernel.params[p[0]].name: str(v) for p, v in constexprs.items() if kernel.params[p[0]].name in sm90.FLAGS}
        return dict(kernel=kernel.fn.__name__, flags=flags, regs=usage["reg"],
                    spills=(usage["stack"] + usage["local"]) // 4, sass_total=len(sass), sass_ops=dict(ops),
                    ttgir_convert_layout=len(re.findall(r"ttg\.convert_layout", ttgir)),
                    ttgir_exp=len(re.findall(r"math\.exp2|tt\.extern_elementwise", ttgir)))


c = Counter()
sm90.patch(c)
for docs in (0, 16):
    sm90.run_case("rglru", "triton_chunked", (1, 4096, 2048), torch.bfloat16, docs, with_state=False, final_grad=False)
rows = [r for r in c.rows.values() if r["kernel"].startswith("_rglru")]
json.dump(rows, open(out, "w"), indent=1)
for r in rows:
    print(f"{r['kernel']:28} VARLEN={r['flags'].get('VARLEN')} SUMMARY={r['flags'].get('SUMMARY', '-'):5} "
          f"regs {r['regs']} spills {r['spills']} sass {r['sass_total']} convert {r['ttgir_convert_layout']} "
          f"exp {r['ttgir_exp']} MUFU {r['sass_ops'].get('MUFU', 0)}")
