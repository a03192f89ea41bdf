#!/usr/bin/env python3
"""A compressed-tensors fp8-block checkpoint (`qparity quantize --scheme fp8-block`) rewritten in
transformers' own fine-grained FP8 format (DeepSeek-V3's): the same fp8 weights, each block scale
renamed `weight_scale_inv` (fp32; despite the name a multiplier, FORMATS.md 3.2), and
quantization_config {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme":
"dynamic", "modules_to_not_convert": [the linears left unquantized]}. The tensors keep their
bytes apart from the scale dtype (bf16 scales widen exactly to fp32). Run on the GPU image
(safetensors, torch).

Usage: ct_fp8_block_to_hf.py IN_DIR OUT_DIR
"""
import json
import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file


def main():
    src, dst = sys.argv[1:3]
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    qc = config.get("quantization_config") or {}
    if qc.get("quant_method") != "compressed-tensors":
        sys.exit(f"{src}: not a compressed-tensors checkpoint")
    os.makedirs(dst, exist_ok=True)
    tensors = {}
    for name in sorted(os.listdir(src)):
        if name.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(src, name)))
    out, quantized, linears = {}, set(), set()
    for name, t in tensors.items():
        if name.endswith(".weight_scale"):
            base = name[: -len(".weight_scale")]
            if tensors[base + ".weight"].dtype != torch.float8_e4m3fn:
                sys.exit(f"{name}: its weight is not fp8")
            out[base + ".weight_scale_inv"] = t.to(torch.float32).contiguous()
            quantized.add(base)
        elif name.endswith(".input_scale"):
            sys.exit(f"{name}: a static input scale; fp8-block is dynamic")
        else:
            out[name] = t
            if name.endswith("_proj.weight") or name.endswith("lm_head.weight"):
                linears.add(name[: -len(".weight")])
    skip = sorted(linears - quantized)
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128],
                                     "activation_scheme": "dynamic", "fmt": "e4m3",
                                     "modules_to_not_convert": skip}
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    for extra in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        if os.path.exists(os.path.join(src, extra)):
            shutil.copy(os.path.join(src, extra), dst)
    print(f"ct_fp8_block_to_hf: {len(quantized)} fp8 linears, {len(skip)} left unconverted -> {dst}")


if __name__ == "__main__":
    main()
