#!/usr/bin/env python3
"""check_layering.py on planted trees: an upward include, a sideways one between the engines, a
description file reaching into the methods, an engine include of the reference that no KNOWN
entry excuses, and a stale KNOWN entry each fail; a clean tree and a listed known include pass."""
import pathlib
import subprocess
import sys
import tempfile

CHECK = pathlib.Path(__file__).with_name("check_layering.py")
KNOWN_FILE = "gpu_engine/planned_model_loader.cpp"
KNOWN_INCLUDE = "reference_cpu/models/model_loader.h"


def run(files, known=()):
    with tempfile.TemporaryDirectory() as d:
        for rel, text in files.items():
            p = pathlib.Path(d, rel)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        extra = [a for k in known for a in ("--known", k)]
        r = subprocess.run([sys.executable, str(CHECK), d, *extra], capture_output=True, text=True)
        return r.returncode, r.stdout


def main():
    base = {
        "core/dtype.h": "#pragma once\n",
        "schemes/fp8/fp8_block.cpp": '#include "core/dtype.h"\n#include "schemes/math/numeric.h"\n',
        "gpu_engine/decoder.cpp": '#include "schemes/fp8/fp8_block.h"\n',
    }
    planted = (f"{KNOWN_FILE}={KNOWN_INCLUDE}",)
    failures, cases = [], []

    def expect(name, files, rc, needle, known=()):
        cases.append(name)
        got_rc, out = run(files, known)
        if got_rc != rc or needle not in out:
            failures.append(f"{name}: rc {got_rc} (want {rc}), output:\n{out}")

    expect("clean", base, 0, "every include goes down")
    expect("upward", {**base, "core/x.cpp": '#include "schemes/fp8/fp8_block.h"\n'}, 1,
           "core/x.cpp:1: includes schemes/fp8/fp8_block.h")
    expect("sideways", {**base, "gpu_engine/y.cpp": '\n#include "reference_cpu/layers/rope.h"\n'},
           1, "gpu_engine/y.cpp:2: includes reference_cpu/layers/rope.h")
    expect("description into methods",
           {**base, "schemes/description/plan.cpp": '#include "schemes/fp8/fp8_block.h"\n'}, 1,
           "schemes/description/plan.cpp:1")
    expect("known and still there", {**base, KNOWN_FILE: f'#include "{KNOWN_INCLUDE}"\n'}, 0,
           "known, still to remove", planted)
    expect("known include unlisted", {**base, KNOWN_FILE: f'#include "{KNOWN_INCLUDE}"\n'}, 1,
           f"{KNOWN_FILE}:1: includes {KNOWN_INCLUDE}")
    expect("stale known", base, 1, "strike it from KNOWN", planted)
    for f in failures:
        print(f)
    print(f"{len(cases) - len(failures)}/{len(cases)} planted trees judged right")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
