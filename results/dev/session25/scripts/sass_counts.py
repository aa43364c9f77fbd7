"""Each kernel a mixer variant's forward + backward launches, compiled for sm_90 here (tests/sm90.py): registers,
stack bytes, its STL/LDL (local memory stores and loads) and how many of them sit inside a loop body (a span from a
backward branch's target to the branch), and its float64 instructions. Session 25 ran it at 931f5a5 and on a copy
with patches/mode_table.diff applied:
  TRITON_INTERPRET=0 PYTHONPATH=<tree> python results/dev/session25/scripts/sass_counts.py samu triton_grouped \
      1,32768,2048"""
import re
import subprocess
import sys
import tempfile

import torch

from tests.sm90 import _CUOBJDUMP, Compiler, patch, run_case

FP64 = re.compile(r"\b(DFMA|DADD|DMUL|DSETP|DMNMX|F2F\.F64\.F32|F2F\.F32\.F64|I2F\.F64|F2I\.F64|MUFU\.RCP64H|"
                  r"MUFU\.RSQ64H)\b")


def loop_spans(sass: str):
    """[start, end] byte addresses of every loop body (a branch to an earlier address)."""
    spans = []
    for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+[^;]*?BRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))", sass):
        pc, target = int(m.group(1), 16), m.group(2)
        if target and int(target, 16) < pc:
            spans.append((int(target, 16), pc))
    return spans


class Counts(Compiler):
    def record(self, kernel, constexprs, options, compiled):
        row = super().record(kernel, constexprs, options, compiled)
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(compiled.asm["cubin"])
            f.flush()
            sass = subprocess.run([_CUOBJDUMP, "-sass", f.name], capture_output=True, text=True, check=True).stdout
            usage = subprocess.run([_CUOBJDUMP, "--dump-resource-usage", f.name], capture_output=True, text=True,
                                   check=True).stdout
        local = [int(m.group(1), 16) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?P\d\s+)?(?:STL|LDL)\b", sass)]
        spans = loop_spans(sass)
        row.update(stack=int(re.search(r"STACK:(\d+)", usage).group(1)), local_ops=len(local),
                   local_ops_in_loops=sum(any(a <= pc <= b for a, b in spans) for pc in local),
                   fp64=len(FP64.findall(sass)))
        return row


def main():
    op, variant, shape = sys.argv[1], sys.argv[2], tuple(int(s) for s in sys.argv[3].split(","))
    compiler = Counts()
    patch(compiler)
    run_case(op, variant, shape, torch.bfloat16, 0)
    for r in compiler.rows.values():
        print(f"{r['kernel']:28s} warps {r['warps']} regs {r['regs']:3d} stack {r['stack']:3d} B  STL+LDL "
              f"{r['local_ops']:3d} (in loops {r['local_ops_in_loops']})  float64 instructions {r['fp64']:4d}")


if __name__ == "__main__":
    main()
