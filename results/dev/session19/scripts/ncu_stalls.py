"""Stall reasons from Nsight Compute source-counter CSVs (gpu_ncu.sh), and which opcodes wait on a long scoreboard."""
import csv, sys, re
from collections import Counter
for p in sys.argv[1:]:
    rows=list(csv.reader(open(p))); h=rows[1]
    cols=[c for c in h if c.startswith('stall_') and 'Not Issued' not in c]
    tot=Counter(); byop={}
    for r in rows[2:]:
        if len(r)<len(h): continue
        src=r[h.index('Source')].strip()
        m=re.match(r"(@!?U?P\w+\s+)?([A-Z0-9_]+)", src); op=m.group(2) if m else '?'
        for c in cols:
            v=int(r[h.index(c)].replace(',','') or 0); tot[c]+=v
            if c=='stall_long_sb': byop[op]=byop.get(op,0)+v
    s=sum(tot.values())
    print(p.split('/')[-1], s, {k[6:]:round(v/s,3) for k,v in tot.most_common(8)})
    print('   long_sb stalls by the instruction that waits:', sorted(byop.items(), key=lambda x:-x[1])[:8])
