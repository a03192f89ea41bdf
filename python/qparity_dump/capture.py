"""Runs a PyTorch model over token sequences with a name map's hooks installed and writes the
candidate: the library call behind `python -m qparity_dump hf`, for any engine whose model is an
nn.Module."""
import json
import os

import numpy as np

from .catalog import ModelShape
from .recorder import Recorder, to_numpy
from .torch_hooks import install
from .writer import Candidate

_DTYPES = {"torch.bfloat16": "BF16", "torch.float16": "F16", "torch.float32": "F32",
           "torch.float64": "F64"}


def device_name(device):
    """"NVIDIA H100 80GB HBM3 sm90" for a CUDA device (the form qparity's policies key on),
    "cpu" otherwise."""
    import torch
    device = torch.device(device)
    if device.type != "cuda":
        return device.type
    major, minor = torch.cuda.get_device_capability(device)
    return f"{torch.cuda.get_device_name(device)} sm{major}{minor}"


def model_shape(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        return ModelShape(json.load(f))


def dump(model, engine_map, model_dir, tokens, out, producer, forward=None, batch=1,
         overwrite=False, extra_hooks=None, **meta):
    """Runs `forward(ids [B, T]) -> logits [B, T, V]` (default: model(input_ids=ids).logits)
    over the [S, T] tokens, B sequences per call, records every point the map taps, and writes
    the candidate to `out`. `meta`: Candidate attributes (scheme, dialect, precision_mode...)."""
    import torch
    tokens = np.asarray(tokens, dtype=np.int64)
    if tokens.ndim == 1:
        tokens = tokens.reshape(1, -1)
    shape = model_shape(model_dir)
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is not None:
        shape.check_moe_layers([hasattr(getattr(l, "mlp", None), "experts") for l in layers],
                               f"{model_dir}: {type(model).__name__}")
    taps, expected, absent = engine_map.plan(shape)
    recorder = Recorder(expected)
    param = next(model.parameters())
    if forward is None:
        def forward(ids):
            return model(input_ids=ids, use_cache=False).logits
    logits = []
    hooks = install(model, taps, recorder)
    declare_more = list  # () -> [(glob, reason)]: what the extra hooks could not see
    try:
        # e.g. activation codes: (model, recorder) -> (Hooks, declare_more), declare_more asked
        # after the run
        if extra_hooks is not None:
            extra, declare_more = extra_hooks(model, recorder)
            hooks.handles += extra.handles
            hooks.patches += extra.patches
        with torch.no_grad():
            for s in range(0, tokens.shape[0], batch):
                chunk = tokens[s:s + batch]
                recorder.begin(chunk.shape[0], chunk.shape[1])
                y = forward(torch.as_tensor(chunk, device=param.device))
                logits.append(to_numpy(getattr(y, "logits", y)).reshape(chunk.size, -1))
                recorder.end()
    finally:
        hooks.remove()
    meta.setdefault("device", device_name(param.device))
    meta.setdefault("model_dtype", _DTYPES.get(str(param.dtype), ""))
    meta.setdefault("input_set", f"file:{tokens.shape[0]}x{tokens.shape[1]}")
    cand = Candidate.for_checkpoint(model_dir, tokens, producer, **meta)
    recorder.fill(cand, list(absent) + list(declare_more()))
    cand.set_logits(np.concatenate(logits, axis=0))
    return cand.write(out, overwrite=overwrite)
