#!/usr/bin/env python3
"""A HOWTO page's touch points against the code.

  scheme: docs/HOWTO-add-a-scheme.md names every source file that switches over SchemeKind
          (`case SchemeKind::`)
  model:  docs/HOWTO-add-a-model.md names every source file that names an Arch (`Arch::k`)
Sources are outside tests. Every path the page names in backticks must exist (a placeholder such
as `schemes/<family>/` stands for a folder pattern and is checked by its fixed prefix). Exit 1
with the differences.

Usage: check_howto.py SOURCE_DIR {scheme|model}
"""
import pathlib
import re
import sys

SOURCES = (".h", ".cpp", ".cu", ".cuh")
SKIP = ("tests/", "build", "fuzz/corpus/")
PAGES = {
    "scheme": ("docs/HOWTO-add-a-scheme.md", re.compile(r"case SchemeKind::"), "switches over SchemeKind"),
    "model": ("docs/HOWTO-add-a-model.md", re.compile(r"\bArch::k[A-Z]"), "names an Arch"),
}


def main():
    if len(sys.argv) != 3 or sys.argv[2] not in PAGES:
        print(__doc__, file=sys.stderr)
        return 2
    root = pathlib.Path(sys.argv[1]).resolve()
    page_path, pattern, what = PAGES[sys.argv[2]]
    page = (root / page_path).read_text(encoding="utf-8")
    named = set(re.findall(r"`([A-Za-z0-9_./<>-]+)`", page))
    paths = {n for n in named if "/" in n and not n.startswith("-")}
    problems = []
    for p in sorted(paths):
        fixed = p.split("<", 1)[0]
        if not (root / fixed).exists():
            problems.append(f"{page_path} names {p}, which does not exist")
    for f in sorted(root.rglob("*")):
        rel = f.relative_to(root).as_posix()
        if f.suffix not in SOURCES or rel.startswith(SKIP) or not f.is_file():
            continue
        if pattern.search(f.read_text(encoding="utf-8", errors="replace")) and rel not in paths:
            problems.append(f"{rel} {what} but {page_path} does not name it")
    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"{page_path}: {len(paths)} paths, every file that {what} named")
    return 0


if __name__ == "__main__":
    sys.exit(main())
