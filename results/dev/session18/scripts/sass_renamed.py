"""Session 18, no GPU: of the launches scripts/sass_same.py finds different, which differ only by a renaming of
registers and spill slots, the same instructions in the same order with the same dataflow. A launch passes when one
consistent one-to-one map of register names (R, UR, P, UP) and one of local-memory offsets turn A's SASS into B's.
Usage: python sass_renamed.py A.json B.json"""
import json
import re
import sys

TOKEN = re.compile(r"\b(U?R\d+|U?P\d+)\b|\[R1(?:\+(0x[0-9a-f]+))?\]")


def renaming(a_lines, b_lines):
    """True when b is a with registers and R1-relative offsets renamed consistently, both ways."""
    if len(a_lines) != len(b_lines):
        return False
    fwd, back = {}, {}
    for x, y in zip(a_lines, b_lines):
        if TOKEN.sub("#", x) != TOKEN.sub("#", y):
            return False
        for u, v in zip(TOKEN.findall(x), TOKEN.findall(y)):
            u, v = u[0] or "slot" + (u[1] or "0"), v[0] or "slot" + (v[1] or "0")
            if fwd.setdefault(u, v) != v or back.setdefault(v, u) != u:
                return False
    return True


a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
differ = [k for k in a if a[k] != b.get(k)]
renamed = [k for k in differ if k in b and renaming(a[k], b[k])]
for k in differ:
    print("renamed " if k in renamed else "DIFFERS ", k[:150])
print(f"{len(a) - len(differ)} of {len(a)} launches the same SASS; {len(renamed)} of the other {len(differ)} "
      "the same instructions with registers and spill slots renamed")
sys.exit(0 if len(renamed) == len(differ) and set(a) == set(b) else 1)
