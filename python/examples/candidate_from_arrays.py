"""Any engine's activations -> a qparity candidate: python candidate_from_arrays.py MODEL_DIR
GOLDEN.h5 OUT.h5 (the README's example; tests/integration/test_cli_python_candidate.cpp runs it)."""
import sys

import h5py
import qparity_dump as qd

model_dir, golden, out = sys.argv[1:4]
tokens = qd.read_tokens(golden)  # the golden's own [S, T] token sequences
# Run your engine on `tokens`, each sequence from an empty KV cache, and keep per capture point
# an array [S*T, width] (or [S, T, width]) and the logits. Here: the golden's own numbers.
with h5py.File(golden, "r") as g:
    acts = {n: g["points"][n][()] for n in g["points"] if not n.endswith(".attn.core")}
    logits = g["outputs/logits"][()]
cand = qd.Candidate.for_checkpoint(model_dir, tokens, producer="my-engine", scheme="bf16",
                                   device="NVIDIA H100 80GB HBM3 sm90", model_dtype="BF16")
for name, values in acts.items():
    cand.add_point(name, values)
cand.declare_absent("layers.*.attn.core", "fused attention kernel")
cand.set_logits(logits)
cand.write(out)
