"""Writes a candidate with qparity_dump from a golden's own data (driven by the C++ test
tests/integration/test_cli_python_candidate.cpp): the same numbers, so compare must find them
bit for bit equal. Modes: declared (attn.core left out and declared absent), undeclared (left
out silently), contradict (declared absent but present: written with h5py behind the writer's
back, which refuses it), perturbed (declared, and layers.0.attn.out scaled by 1.05). Exit 2 when the package's checkpoint hashes differ from the golden's."""
import argparse
import sys

import h5py
import numpy as np

from qparity_dump import Candidate, checkpoint_hash, config_hash


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--golden", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", choices=["declared", "undeclared", "contradict", "perturbed",
                                         "relabelled"], required=True)
    a = ap.parse_args()
    with h5py.File(a.golden, "r") as g:
        for name, got in (("model_config_hash", config_hash(a.model)),
                          ("checkpoint_hash", checkpoint_hash(a.model))):
            if g.attrs[name] != got:
                print(f"{name}: python {got} != golden {g.attrs[name]}", file=sys.stderr)
                return 2
        c = Candidate.for_checkpoint(a.model, g["inputs/tokens"][()], "python-roundtrip",
                                     producer_version="test",
                                     scheme="fp8-block" if a.mode == "relabelled" else g.attrs["scheme"],
                                     device="NVIDIA Test GPU sm90", model_dtype="BF16",
                                     point_dtype="float64")
        for name in g["points"]:
            if name.endswith(".attn.core") and a.mode != "contradict":
                continue
            values = g["points"][name][()]
            c.add_point(name, values * 1.05 if a.mode == "perturbed" and
                        name == "layers.0.attn.out" else values)
        if a.mode in ("declared", "perturbed", "relabelled"):
            c.declare_absent("layers.*.attn.core", "written by the round-trip test")
        c.set_logits(g["outputs/logits"][()])
        c.write(a.out, overwrite=True)
    if a.mode == "contradict":
        with h5py.File(a.out, "r+") as f:
            f.attrs.create("absent_points", np.array(["layers.*.attn.core: but it is here"],
                                                     dtype=object), dtype=h5py.string_dtype())
    return 0


if __name__ == "__main__":
    sys.exit(main())
