#!/usr/bin/env python3
"""Relative L2 difference, capture point by capture point, between two trace files (qparity
trace / tools/peers/hf_reference.py), over the names both hold (tokens, where both have them,
must be equal; vision traces have none).

Usage: compare_traces.py A.safetensors B.safetensors [--bound 1e-12] [--json OUT]
Exit status 1 when any common point exceeds the bound or no point is shared.
"""
import argparse
import json
import sys

import torch
from safetensors.torch import load_file


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--bound", type=float, default=1e-12)
    ap.add_argument("--json")
    x = ap.parse_args()
    a, b = load_file(x.a), load_file(x.b)
    if ("tokens" in a) != ("tokens" in b):
        sys.exit("one trace has tokens and the other not")
    if "tokens" in a and not torch.equal(a["tokens"].to(torch.int64), b["tokens"].to(torch.int64)):
        sys.exit("the two traces ran different tokens")
    names = [n for n in a if n in b and n != "tokens"]
    rows, worst = [], 0.0
    for n in names:
        ta, tb = a[n].double(), b[n].double()
        if ta.shape != tb.shape:
            rows.append({"point": n, "error": f"shape {list(ta.shape)} vs {list(tb.shape)}"})
            worst = float("inf")
            continue
        den = tb.norm().item()
        rel = (ta - tb).norm().item() / den if den > 0 else (ta - tb).norm().item()
        rows.append({"point": n, "rel_l2": rel})
        worst = max(worst, rel)
        print(f"{rel:10.3e}  {n}")
    print(f"{len(names)} common capture points, worst rel L2 {worst:.3e} (bound {x.bound:g})")
    if x.json:
        with open(x.json, "w") as f:
            json.dump({"a": x.a, "b": x.b, "bound": x.bound, "worst": worst, "points": rows}, f,
                      indent=1)
    sys.exit(0 if names and worst <= x.bound else 1)


if __name__ == "__main__":
    main()
