#!/usr/bin/env python3
"""Writes tests/data/torch_saved.safetensors with safetensors.torch.save_file (run on the GPU
image, which has torch and safetensors). The values are fixed here and repeated in
tests/unit/test_safetensors.cpp, which reads the file back and also re-serializes it with
qparity's writer to check byte compatibility."""
import sys

import torch
from safetensors.torch import save_file

out = sys.argv[1]
ramp = (torch.arange(12, dtype=torch.float64) * 0.5 - 1.0).reshape(3, 4)
tensors = {
    "f64": ramp.clone(),
    "f32": ramp.to(torch.float32),
    "bf16": ramp.to(torch.bfloat16),
    "f16": ramp.to(torch.float16),
    # All inside +-448, so torch's non-saturating cast and a clamped one agree.
    "f8_e4m3": torch.tensor([0, 0.5, -1.5, 448, -448, 0.001953125, 300, -2.75, 0.3],
                            dtype=torch.float64).to(torch.float8_e4m3fn),
    "f8_e5m2": torch.tensor([0, 0.5, -1.5, 57344, -3.0e-5, 0.3],
                            dtype=torch.float64).to(torch.float8_e5m2),
    "i8": torch.arange(-4, 4, dtype=torch.int8),
    "u8": torch.arange(0, 251, 50, dtype=torch.uint8),
    "i32": torch.tensor([-2**31, -1, 0, 2**31 - 1], dtype=torch.int32),
    "i64": torch.tensor([-2**53, 0, 2**53], dtype=torch.int64),
    "bool": torch.tensor([True, False, True]),
}
if hasattr(torch, "float8_e8m0fnu"):
    tensors["f8_e8m0"] = torch.tensor([1.0, 2.0, 0.5, 2.0**-127, 2.0**127],
                                      dtype=torch.float32).to(torch.float8_e8m0fnu)
save_file(tensors, out, metadata={"producer": "qparity-fixture"})
print("wrote", out, "torch", torch.__version__, "tensors", sorted(tensors))
