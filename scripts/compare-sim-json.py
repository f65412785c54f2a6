#!/usr/bin/env python3
"""Compare two folders of `gpuroute sim --json` outputs, ignoring wall-clock fields.

Usage: scripts/compare-sim-json.py BEFORE_DIR AFTER_DIR (the layout refactor's check)."""

import json
import pathlib
import sys


def strip(x):
    if isinstance(x, dict):
        return {k: strip(v) for k, v in x.items() if "wall" not in k}
    if isinstance(x, list):
        return [strip(v) for v in x]
    return x


def main(before: pathlib.Path, after: pathlib.Path) -> int:
    different = 0
    for f in sorted(before.glob("*.json")):
        g = after / f.name
        if not g.exists():
            print(f"{f.name}: missing in {after}")
            different += 1
            continue
        same = strip(json.loads(f.read_text())) == strip(json.loads(g.read_text()))
        different += not same
        print(f"{f.name}: {'identical' if same else 'DIFFERENT'}")
    return 1 if different else 0


if __name__ == "__main__":
    sys.exit(main(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])))
