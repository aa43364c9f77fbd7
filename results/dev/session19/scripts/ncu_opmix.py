"""Executed instructions by opcode from two Nsight Compute source-counter CSVs (gpu_ncu.sh): A against B."""
import csv, sys, re
from collections import Counter
def load(p):
    rows = list(csv.reader(open(p)))
    hdr = rows[1]; i_src = hdr.index("Source"); i_ex = hdr.index("Instructions Executed"); i_st = hdr.index("Warp Stall Sampling (All Samples)")
    ops, stalls = Counter(), Counter()
    for r in rows[2:]:
        if len(r) <= i_ex: continue
        src = r[i_src].strip()
        m = re.match(r"(@!?U?P\w+\s+)?([A-Z0-9_.]+)", src)
        if not m: continue
        op = m.group(2).split('.')[0]
        ops[op] += int(r[i_ex].replace(',', '') or 0); stalls[op] += int(r[i_st].replace(',', '') or 0)
    return ops, stalls
a, sa = load(sys.argv[1]); b, sb = load(sys.argv[2])
print(f"total executed {sum(a.values())/1e6:.1f}M vs {sum(b.values())/1e6:.1f}M; stall samples {sum(sa.values())} vs {sum(sb.values())}")
keys = sorted(set(a) | set(b), key=lambda k: -(b[k] - a[k]))
for k in keys[:25]:
    print(f"{k:10s} {a[k]/1e6:8.2f}M {b[k]/1e6:8.2f}M  diff {(b[k]-a[k])/1e6:+7.2f}M   stalls {sa[k]:7d} {sb[k]:7d}")
