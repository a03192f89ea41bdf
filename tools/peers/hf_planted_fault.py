#!/usr/bin/env python3
"""Hugging Face transformers with one fault planted by monkeypatching, dumped as a qparity
candidate (python/qparity_dump), for `qparity bisect` to find (run on the GPU image).

Faults:
  o_proj-scale   layer L's o_proj output multiplied by --factor (a wrong dequantization scale);
                 bisect should stop at layers.L.attn.out.
  router-renorm  layer L's MoE router without the top-k renormalisation (norm_topk_prob off);
                 bisect should stop at layers.L.moe.topk_weights.

Usage: hf_planted_fault.py --model DIR --tokens GOLDEN.h5 --out CAND.h5 --fault F [--layer L]
       [--factor 1.25] [--dtype bf16] [--device cuda]
"""
import argparse
import sys

import transformers

from qparity_dump import read_tokens
from qparity_dump.capture import dump
from qparity_dump.hf import load, map_for


def plant(model, fault, layer, factor):
    block = model.model.layers[layer]
    if fault == "o_proj-scale":
        proj = block.self_attn.o_proj
        original = proj.forward
        proj.forward = lambda x: original(x) * factor  # hooks still see the module's output
        return f"layers.{layer}.attn.out"
    if fault == "router-renorm":
        for owner in (block.mlp.gate, block.mlp):  # 5.x: the router; 4.x: the MoE block
            if hasattr(owner, "norm_topk_prob"):
                if not owner.norm_topk_prob:
                    sys.exit(f"layer {layer}: norm_topk_prob is already off; nothing to plant")
                owner.norm_topk_prob = False
                return f"layers.{layer}.moe.topk_weights"
        sys.exit(f"layer {layer}: no norm_topk_prob attribute on the router or the MoE block")
    sys.exit(f"unknown fault {fault}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--fault", required=True, choices=["o_proj-scale", "router-renorm"])
    ap.add_argument("--layer", type=int,
                    help="default: layer 1 (o_proj-scale), the first MoE layer (router-renorm)")
    ap.add_argument("--factor", type=float, default=1.25)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    model = load(a.model, a.dtype, a.device)
    if a.layer is None:
        moe = [i for i, l in enumerate(model.model.layers) if hasattr(l.mlp, "experts")]
        if a.fault == "router-renorm" and not moe:
            sys.exit("router-renorm: the model has no MoE layer")
        a.layer = moe[0] if a.fault == "router-renorm" else 1
    where = plant(model, a.fault, a.layer, a.factor)
    dump(model, map_for(model), a.model, read_tokens(a.tokens), a.out, "hf-transformers",
         batch=8, overwrite=True, producer_version=transformers.__version__,
         precision_mode=f"transformers-sdpa-{a.dtype}+planted-{a.fault}")
    print(f"hf_planted_fault: {a.fault} in layer {a.layer}; expected first failing point {where}")


if __name__ == "__main__":
    main()
