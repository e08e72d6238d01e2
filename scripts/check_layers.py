#!/usr/bin/env python3
"""Fails when an #include points the wrong way between TrainFlow's layers (a CTest test).

Each folder is a layer and may include only the layers listed for it below (and itself). The
table is the architecture (README.md "Layout"): base/ at the bottom; kernels/, comm/, model/,
checkpoint/ and monitor/ above it; launch/ (the scheduling layer) on monitor/ alone, so that the
supervisor never links the trainer; engine/ (the training core) and engine/data/ beside it; and
engine/cli/, the commands of the binary, on top. tests/ and bench/ may include anything.

  python3 scripts/check_layers.py [--root DIR]
"""
import argparse
import os
import re
import sys

ALLOWED = {
    "base": set(),
    "kernels": {"base"},
    "comm": {"base", "kernels"},
    "model": {"base", "kernels"},
    "checkpoint": {"base"},
    "monitor": {"base"},
    "launch": {"base", "monitor"},
    "engine/data": {"base", "model"},
    "engine": {"base", "kernels", "comm", "model", "checkpoint", "monitor", "engine/data"},
    "engine/cli": {"base", "kernels", "comm", "model", "checkpoint", "monitor", "launch", "engine",
                   "engine/data"},
}
SOURCE_SUFFIXES = (".h", ".cpp", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(path):
    """The layer a repository path belongs to, or None outside the layered folders."""
    parts = path.split("/")
    if len(parts) > 2 and parts[0] == "engine" and "engine/" + parts[1] in ALLOWED:
        return "engine/" + parts[1]
    return parts[0] if len(parts) > 1 and parts[0] in ALLOWED else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    errors, checked = [], 0
    for top in ALLOWED:
        if "/" in top:
            continue
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for name in sorted(names):
                if not name.endswith(SOURCE_SUFFIXES):
                    continue
                path = os.path.relpath(os.path.join(dirpath, name), root)
                here = layer_of(path)
                with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
                    text = f.read()
                checked += 1
                for m in INCLUDE.finditer(text):
                    target = layer_of(m.group(1))
                    if target is None or target == here or target in ALLOWED[here]:
                        continue
                    line = text.count("\n", 0, m.start()) + 1
                    errors.append(f"{path}:{line}: includes {m.group(1)}: layer {here} may include only "
                                  f"{', '.join(sorted(ALLOWED[here] | {here}))}")
    for e in errors:
        print(e)
    if checked == 0:
        print(f"no sources under {root}: wrong --root?")
        return 1
    print(f"{checked} files checked, {len(errors)} include(s) against the layers")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
