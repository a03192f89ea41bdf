#!/usr/bin/env python3
"""Hugging Face transformers' Qwen3-VL vision tower as the peer of `qparity trace-vision` (run on
the GPU image; never in CI).

--make-pixels writes a pixel file (seeded normal `pixel_values` [N, C*T*P*P] in F64 and
`image_grid_thw` I64 [n, 3] from --grids) for both sides to read; then the checkpoint's
`model.visual` runs on it in float64 and the points qparity names are recorded:
  visual.embed (the first block's input: patch embedding + interpolated positions),
  visual.blocks.<i>.out, visual.deepstack.<j>, visual.merger.
float64 alone leaves float32 in the tower: torch.linspace of the position interpolation uses the
default dtype, and the rotary's inv_freq and apply_rotary_pos_emb_vision cast with .float(). By
default the default dtype is float64 while it runs and torch.float / torch.float32 /
Tensor.float() mean float64 (hf_reference.float_is_double: transformers 5.17 builds the position
interpolation weights with an explicit float32, about 1e-9 relative on the tower's output);
--stock keeps transformers' behaviour.

Usage: hf_vision_reference.py --model DIR --pixels F [--make-pixels --grids 1,4,4;2,4,6 --seed N]
       --out F [--stock]
"""
import argparse
import contextlib
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_reference import float_is_double  # noqa: E402


@contextlib.contextmanager
def default_dtype(dtype, enabled):
    if not enabled:
        yield
        return
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--pixels", required=True)
    ap.add_argument("--make-pixels", action="store_true")
    ap.add_argument("--grids", default="1,4,4;1,6,8;2,4,6")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--out", required=True)
    ap.add_argument("--stock", action="store_true")
    a = ap.parse_args()

    with open(os.path.join(a.model, "config.json")) as f:
        config = json.load(f)
    vc = config["vision_config"]
    if a.make_pixels:
        grids = torch.tensor([[int(x) for x in g.split(",")] for g in a.grids.split(";")],
                             dtype=torch.int64)
        n = int(grids.prod(dim=1).sum())
        width = vc.get("in_channels", 3) * vc["temporal_patch_size"] * vc["patch_size"] ** 2
        gen = torch.Generator().manual_seed(a.seed)
        save_file({"pixel_values": torch.randn(n, width, generator=gen, dtype=torch.float64),
                   "image_grid_thw": grids}, a.pixels)
    px = load_file(a.pixels)

    import transformers
    patched = not a.stock
    cls = getattr(transformers, config["architectures"][0])
    with float_is_double(patched, True):
        model = cls.from_pretrained(a.model, dtype=torch.float64, attn_implementation="sdpa")
    model.eval()
    visual = model.model.visual

    out = {}

    def keep(name):
        def hook(_m, _i, output):
            out[name] = (output[0] if isinstance(output, tuple) else output).detach().double().clone()
        return hook

    def keep_input(name):
        def hook(_m, inputs):
            out[name] = inputs[0].detach().double().clone()
        return hook

    visual.blocks[0].register_forward_pre_hook(keep_input("visual.embed"))
    for i, blk in enumerate(visual.blocks):
        blk.register_forward_hook(keep(f"visual.blocks.{i}.out"))
    with torch.no_grad(), float_is_double(patched, True), default_dtype(torch.float64, patched):
        result = visual(px["pixel_values"].to(torch.float64), grid_thw=px["image_grid_thw"])
    merged, deepstack = (result[0], result[1]) if isinstance(result, tuple) else (
        result.pooler_output if hasattr(result, "pooler_output") else result.last_hidden_state,
        getattr(result, "deepstack_features", None) or [])
    out["visual.merger"] = merged.detach().double().clone()
    for j, d in enumerate(deepstack):
        out[f"visual.deepstack.{j}"] = d.detach().double().clone()
    save_file(out, a.out, metadata={"producer": "tools/peers/hf_vision_reference.py",
                                    "mode": "stock" if a.stock else "fp64-patched"})
    print(f"hf_vision_reference: {px['pixel_values'].shape[0]} patches, {len(out)} points -> {a.out}")


if __name__ == "__main__":
    main()
