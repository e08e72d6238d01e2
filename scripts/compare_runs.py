#!/usr/bin/env python3
"""How far apart two trainflow weight files are, tensor by tensor.

  python3 scripts/compare_runs.py A/model.safetensors B/model.safetensors [--all]

Prints how many tensors differ (bit for bit), the largest absolute difference and the largest
relative one (a tensor's largest |a - b| over its largest |a|), with the tensor each comes from;
--all prints every tensor's line. Exit 0 when the files hold bit-identical tensors, 1 when they
differ, 2 when they cannot be compared (different names, shapes or dtypes, a file that is not
safetensors). Python's standard library only (F32, F16 and BF16 tensors).
"""

import argparse
import array
import json
import struct
import sys

DTYPES = {"F32": "f", "F16": "e", "BF16": "bf16"}


def read(path):
    """{name: (dtype, shape, raw bytes)} of a safetensors file (metadata left out)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: not a safetensors file (shorter than 8 bytes)")
    n = struct.unpack("<Q", data[:8])[0]
    if n > len(data) - 8:
        raise ValueError(f"{path}: header length {n} is beyond the file's end")
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        out[name] = (e["dtype"], tuple(e["shape"]), body[begin:end])
    return out


def values(dtype, raw):
    code = DTYPES.get(dtype)
    if code is None:
        raise ValueError(f"dtype {dtype} is not supported (F32, F16, BF16)")
    if code == "bf16":  # the upper half of an fp32
        halves = array.array("H", raw)
        return array.array("f", struct.pack(f"<{len(halves)}I", *(h << 16 for h in halves)))
    a = array.array(code)
    a.frombytes(raw)
    return a


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="the reference model.safetensors")
    ap.add_argument("b", help="the one compared with it")
    ap.add_argument("--all", action="store_true", help="a line for every tensor")
    args = ap.parse_args()
    try:
        ta, tb = read(args.a), read(args.b)
    except (OSError, ValueError, KeyError) as e:
        print(f"cannot read: {e}", file=sys.stderr)
        return 2
    if ta.keys() != tb.keys():
        print(f"the files hold different tensors: only in A {sorted(ta.keys() - tb.keys())[:5]}, "
              f"only in B {sorted(tb.keys() - ta.keys())[:5]}", file=sys.stderr)
        return 2
    differ, elements, differing_elements = 0, 0, 0
    worst_abs, worst_rel = (0.0, None), (0.0, None)
    for name in sorted(ta):
        (da, sa, ra), (db, sb, rb) = ta[name], tb[name]
        if (da, sa) != (db, sb):
            print(f"{name}: {da}{list(sa)} vs {db}{list(sb)}: not comparable", file=sys.stderr)
            return 2
        try:
            va, vb = values(da, ra), values(db, rb)
        except ValueError as e:
            print(f"{name}: {e}", file=sys.stderr)
            return 2
        elements += len(va)
        if ra == rb:
            if args.all:
                print(f"  {name}: identical ({len(va)} values)")
            continue
        differ += 1
        t_abs = 0.0
        n = 0
        for x, y in zip(va, vb):
            if x == y:
                continue
            n += 1
            t_abs = max(t_abs, abs(x - y))
        scale = max((abs(x) for x in va), default=0.0)
        t_rel = t_abs / scale if scale > 0 else float("inf")
        differing_elements += n
        if t_abs > worst_abs[0]:
            worst_abs = (t_abs, name)
        if t_rel > worst_rel[0]:
            worst_rel = (t_rel, name)
        if args.all:
            print(f"  {name}: {n} of {len(va)} values differ, max abs {t_abs:.3g}, max rel {t_rel:.3g}")
    print(f"{differ} of {len(ta)} tensors differ ({differing_elements} of {elements} values); "
          f"max abs difference {worst_abs[0]:.3g}" + (f" ({worst_abs[1]})" if worst_abs[1] else "") +
          f", max relative {worst_rel[0]:.3g}" + (f" ({worst_rel[1]})" if worst_rel[1] else ""))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
