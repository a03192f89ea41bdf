#!/usr/bin/env python3
"""check_layering.py on planted trees: an upward include, a sideways one between the engines, a
description file reaching into the methods, and a stale KNOWN entry each fail; a clean tree
passes."""
import pathlib
import subprocess
import sys
import tempfile

CHECK = pathlib.Path(__file__).with_name("check_layering.py")
KNOWN_FILE = "gpu_engine/planned_model_loader.cpp"
KNOWN_INCLUDE = "reference_cpu/models/model_loader.h"


def run(files):
    with tempfile.TemporaryDirectory() as d:
        for rel, text in files.items():
            p = pathlib.Path(d, rel)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        r = subprocess.run([sys.executable, str(CHECK), d], capture_output=True, text=True)
        return r.returncode, r.stdout


def main():
    base = {
        "core/dtype.h": "#pragma once\n",
        "schemes/fp8/fp8_block.cpp": '#include "core/dtype.h"\n#include "schemes/math/numeric.h"\n',
        "gpu_engine/decoder.cpp": '#include "schemes/fp8/fp8_block.h"\n',
        KNOWN_FILE: f'#include "{KNOWN_INCLUDE}"\n',
    }
    failures = []

    def expect(name, files, rc, needle):
        got_rc, out = run(files)
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
    expect("stale known", {k: v for k, v in base.items() if k != KNOWN_FILE}, 1,
           "strike it from KNOWN")
    for f in failures:
        print(f)
    print(f"{5 - len(failures)}/5 planted trees judged right")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
