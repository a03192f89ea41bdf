#!/usr/bin/env python3
"""docs/HOWTO-add-a-scheme.md against the code: every source file (outside tests) that switches
over SchemeKind (`case SchemeKind::`) is named on the page, and every path the page names in
backticks exists (a placeholder such as `schemes/<family>/` stands for a folder pattern and is
checked by its fixed prefix). Exit 1 with the differences.

Usage: check_howto_scheme.py SOURCE_DIR
"""
import pathlib
import re
import sys

SOURCES = (".h", ".cpp", ".cu", ".cuh")
SKIP = ("tests/", "build", "fuzz/corpus/")


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = pathlib.Path(sys.argv[1]).resolve()
    page = (root / "docs" / "HOWTO-add-a-scheme.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`([A-Za-z0-9_./<>-]+)`", page))
    paths = {n for n in named if "/" in n and not n.startswith("-")}
    problems = []
    for p in sorted(paths):
        fixed = p.split("<", 1)[0]
        if not (root / fixed).exists():
            problems.append(f"the page names {p}, which does not exist")
    for f in sorted(root.rglob("*")):
        rel = f.relative_to(root).as_posix()
        if f.suffix not in SOURCES or rel.startswith(SKIP) or not f.is_file():
            continue
        if "case SchemeKind::" in f.read_text(encoding="utf-8", errors="replace"):
            if rel not in paths:
                problems.append(f"{rel} switches over SchemeKind but the page does not name it")
    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"HOWTO-add-a-scheme.md: {len(paths)} paths, every SchemeKind switch named")
    return 0


if __name__ == "__main__":
    sys.exit(main())
