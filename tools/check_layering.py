#!/usr/bin/env python3
"""Fails on any #include that goes up or sideways in the house (ARCHITECTURE.md, layering):

    core  <-  schemes  <-  {reference_cpu, gpu_engine}  <-  golden, fixtures  <-  tools, bench, tests

Each source file's folder names the folders it may include from (RULES, first match wins). The
two engines are siblings: neither includes the other; both stand on schemes/. Inside schemes/,
the description (config readers, plan, registry) and the sharding rules stand below the methods
and must not include them, so that config readers link without the methods' OpenMP.

KNOWN lists the includes that still break a rule, each with the work that removes it. A known
include that is gone fails too (strike it from the list), so the list can only shrink.

Usage: check_layering.py SOURCE_DIR [--known FILE=INCLUDE ...]
"""
import pathlib
import re
import sys

# (file path regex, folders whose headers it may include); first match wins.
RULES = [
    (r"^core/", ["core/"]),
    (r"^schemes/(description|parallel)/", ["core/", "schemes/description/", "schemes/parallel/"]),
    (r"^schemes/", ["core/", "schemes/"]),
    (r"^reference_cpu/", ["core/", "schemes/", "reference_cpu/"]),
    (r"^gpu_engine/", ["core/", "schemes/", "gpu_engine/"]),
    # The golden producers run an engine; the judge (compare, policy, bisect's tables) does not.
    (r"^golden/(reference_run|layer_rerun|reference_candidate|judge_matrix)\.",
     ["core/", "schemes/", "reference_cpu/", "golden/"]),
    (r"^golden/engine_golden\.", ["core/", "schemes/", "reference_cpu/", "gpu_engine/", "golden/"]),
    (r"^golden/", ["core/", "schemes/description/", "golden/"]),
    (r"^fixtures/", ["core/", "schemes/", "reference_cpu/", "fixtures/"]),
    (r"^fuzz/", ["core/", "schemes/description/", "golden/"]),
    (r"^(tools|bench|tests)/", None),  # the top floor: anything below
]

# file -> includes that break its rule today, and why they are still there. Empty since issue 51
# item 2 (the GPU engine loads through schemes/loading/, not the reference's host model); a
# planted entry (--known FILE=INCLUDE, tools/test_check_layering.py) keeps the rule tested.
KNOWN = {}

PROJECT_FOLDERS = ("core/", "schemes/", "reference_cpu/", "gpu_engine/", "golden/", "fixtures/",
                   "tools/", "bench/", "tests/", "fuzz/")
INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.M)
SOURCES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".inc")


def allowed_for(rel):
    for pattern, allowed in RULES:
        if re.search(pattern, rel):
            return allowed
    return None


def main():
    args = sys.argv[1:]
    if not args or len(args) % 2 != 1 or any(a != "--known" for a in args[1::2]):
        print(__doc__, file=sys.stderr)
        return 2
    for planted in args[2::2]:
        rel, sep, inc = planted.partition("=")
        if not sep:
            print(__doc__, file=sys.stderr)
            return 2
        KNOWN[(rel, inc)] = "planted by --known"
    root = pathlib.Path(args[0]).resolve()
    bad, seen_known = [], set()
    for folder in PROJECT_FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in SOURCES or not path.is_file():
                continue
            rel = path.relative_to(root).as_posix()
            if rel.startswith(("tests/data/", "fuzz/corpus/")):
                continue
            allowed = allowed_for(rel)
            if allowed is None:
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            for m in INCLUDE.finditer(text):
                inc = m.group(1)
                if not inc.startswith(PROJECT_FOLDERS):
                    continue  # a sibling by relative name or a generated file
                if any(inc.startswith(a) for a in allowed):
                    continue
                if (rel, inc) in KNOWN:
                    seen_known.add((rel, inc))
                    continue
                line = text.count("\n", 0, m.start()) + 1
                bad.append(f"{rel}:{line}: includes {inc}; {rel.split('/')[0]}/ may include only "
                           f"{', '.join(allowed)}")
    for key, why in KNOWN.items():
        if key not in seen_known:
            bad.append(f"{key[0]}: no longer includes {key[1]}; strike it from KNOWN in "
                       f"tools/check_layering.py ({why})")
    for b in bad:
        print(b)
    for key, why in sorted(KNOWN.items()):
        if key in seen_known:
            print(f"known, still to remove: {key[0]} -> {key[1]}: {why}")
    if bad:
        print(f"layering: {len(bad)} include(s) against the house's floors")
        return 1
    print("layering: every include goes down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
