"""Session 18 (issue 15), no GPU: scripts/sass_same.py's dump for one mixer's packed launches only, at two shapes,
both variants, three dtypes, four state combinations (``unpacked`` last: its unpacked launches instead). Usage:
python sass_packed.py OP ROOT OUT.json [unpacked] (ROOT: a tree with samu, tests, scripts); then python
scripts/sass_same.py compare A.json B.json, or sass_renamed.py A.json B.json."""
import sys

op, root, out = sys.argv[1], sys.argv[2], sys.argv[3]
packed = sys.argv[4:] != ["unpacked"]
sys.path[:0] = [root, root + "/scripts"]
import sass_same  # noqa: E402
import tests.sm90 as sm90  # noqa: E402

assert sm90.__file__.startswith(root), sm90.__file__
# RG-LRU: head dims 16 and 160; SAMU: a short row and a primary shape
sass_same.SHAPES.update(rglru=((1, 300, 256), (1, 2100, 2560)), samu=((1, 300, 256), (1, 32768, 2048)))
every_case = sm90.run_case


def one_kind(op, variant, shape, dtype, documents, **kw):
    if bool(documents) == packed:
        every_case(op, variant, shape, dtype, documents, **kw)


sm90.run_case = one_kind
sass_same.dump(out, op)
