"""`python -m qparity_dump hf`: Hugging Face transformers as a candidate engine."""
import json
import os

import numpy as np

from .capture import dump
from .maps.hf import hf_map

DTYPES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}


def scheme_of(model_dir):
    """The scheme id of a checkpoint transformers loads: unquantized -> bf16; transformers'
    fine-grained FP8 (quant_method fp8 with weight_block_size) -> fp8-block."""
    with open(os.path.join(model_dir, "config.json")) as f:
        q = json.load(f).get("quantization_config")
    if not q:
        return "bf16"
    if q.get("quant_method") == "fp8" and q.get("weight_block_size"):
        return "fp8-block"
    raise ValueError(f"{model_dir}/config.json: quantization_config {q.get('quant_method')!r} "
                     "has no qparity scheme id here; pass --scheme")


def load(model_dir, dtype="bf16", device="cuda", attn="sdpa"):
    import torch
    from transformers import AutoModelForCausalLM
    torch_dtype = getattr(torch, DTYPES[dtype])
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype,
                                                     attn_implementation=attn)
    except TypeError:  # transformers 4.x spells it torch_dtype
        model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch_dtype,
                                                     attn_implementation=attn)
    return model.to(device).eval()


def map_for(model):
    """5.x routers return (probabilities, weights, ids); 4.x's gate is an nn.Linear."""
    import torch
    for layer in model.model.layers:
        gate = getattr(getattr(layer, "mlp", None), "gate", None)
        if gate is not None and hasattr(layer.mlp, "experts"):
            return hf_map(router_returns_topk=not isinstance(gate, torch.nn.Linear))
    return hf_map(router_returns_topk=True)


# The GEMM inputs whose codes the golden holds, and the transformers module feeding each one
# (q_proj's codes are k_proj's and v_proj's too: they quantize the same input).
_CODE_LINEARS = (("self_attn.q_proj", "attn.qkv_proj"), ("self_attn.o_proj", "attn.o_proj"),
                 ("mlp.gate_proj", "mlp.gate_up_proj"), ("mlp.down_proj", "mlp.down_proj"))


def fp8_code_hooks(model, recorder):
    """transformers' fine-grained FP8 (FP8Linear): the fp8 activation codes and per-128 scales
    each linear feeds its GEMM, taken from `act_quant` of transformers.integrations.
    finegrained_fp8 while the linear runs. What it cannot see is declared absent after the run."""
    from .torch_hooks import Hooks
    hooks, owners, current, seen = Hooks(), {}, {}, set()
    for i, layer in enumerate(model.model.layers):
        for path, lin in _CODE_LINEARS:
            try:
                m = layer.get_submodule(path)
            except AttributeError:
                continue
            if type(m).__name__ == "FP8Linear":
                owners[id(m)] = (m, f"layers.{i}.{lin}")

    def declare():
        if not owners or seen:
            return []
        why = ("transformers' FP8Linear quantized its input without calling finegrained_fp8."
               "act_quant (another kernel path)")
        return [("layers.*.*_proj.x_values", why), ("layers.*.*_proj.x_scales", why)]

    if not owners:
        return hooks, declare
    try:
        import transformers.integrations.finegrained_fp8 as fg
        original = fg.act_quant
    except (ImportError, AttributeError):
        return hooks, declare

    def act_quant(*args, **kwargs):
        q, s = original(*args, **kwargs)
        who = current.get("m")
        if who in owners:
            seen.add(who)
            recorder.put(owners[who][1] + ".x_values", q)
            recorder.put(owners[who][1] + ".x_scales", s)
        return q, s

    hooks.patches.append((fg, "act_quant", original))
    fg.act_quant = act_quant
    for key, (m, _) in owners.items():
        hooks.handles.append(m.register_forward_pre_hook(
            lambda mod, args, key=key: current.__setitem__("m", key)))
        hooks.handles.append(m.register_forward_hook(
            lambda mod, args, out: current.__setitem__("m", None)))
    return hooks, declare


def run(args, tokens):
    import transformers
    model = load(args.model, args.dtype, args.device, args.attn)
    scheme = args.scheme or scheme_of(args.model)
    out = dump(model, map_for(model), args.model, tokens, args.out, "hf-transformers",
               batch=args.batch, overwrite=args.force, scheme=scheme, dialect=args.dialect,
               producer_version=transformers.__version__,
               precision_mode=f"transformers-{args.attn}-{args.dtype}",
               extra_hooks=fp8_code_hooks if scheme == "fp8-block" else None)
    return out, np.asarray(tokens).shape
