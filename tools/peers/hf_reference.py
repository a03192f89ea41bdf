#!/usr/bin/env python3
"""Hugging Face transformers as the model-level peer of qparity's fp64 reference (run on the GPU
image, which has torch and transformers; never in CI).

Loads an unquantized checkpoint directory into transformers on the CPU in float64 and writes the
capture points it can observe, under qparity's names (ARCHITECTURE.md), as F64 [T, ...] tensors:
  embed, layers.<i>.input_norm, layers.<i>.attn.out, layers.<i>.post_attn_norm,
  layers.<i>.mlp.out (dense) or layers.<i>.moe.out (sparse), layers.<i>.residual, final_norm,
  logits; for Qwen3.5 also layers.<i>.linear_attn.core / .linear_attn.norm (Gated DeltaNet
  layers: the delta rule's output and the gated norm's) and layers.<i>.attn.gated (gated
  attention: what o_proj reads).

`dtype=torch.float64` alone is not fp64 throughout: LlamaRMSNorm / Qwen3RMSNorm cast to float32,
the rotary embedding builds inv_freq, the angles and cos/sin in float32, and Qwen3-MoE's router
softmax uses dtype=torch.float. By default those are made float64 (RMSNorm forward replaced by the
same formula without the cast; `torch.float` and `Tensor.float()` mapped to float64 while the model
is built and run; attention through SDPA, which computes in the input dtype on the CPU). Qwen3.5
also casts with .to(torch.float32) (the Gated DeltaNet, its gated norm): torch.float32 is mapped to
float64 too for it; transformers' prefill runs torch_chunk_gated_delta_rule (the chunked form),
so the peer checks the reference's sequential recurrence against it. Image-text checkpoints
(a `text_config` in config.json: Qwen3-VL, Qwen3.5) are built as their own class and run on the
tokens alone, or with --pixels on the tokens and a pixel file (`pixel_values`, `image_grid_thw`:
what `qparity trace --pixels` reads) through the class's own forward (vision tower, placeholder
scatter, M-RoPE positions, deepstack); the vision tower's points (visual.embed,
visual.blocks.<i>.out, visual.deepstack.<j>, visual.merger) join the language model's. There the
vision tower's explicit float32 (its position weights) is float64 too. layers.<i>.residual is
what the next layer reads (the final norm for the last): after the layer's deepstack injection,
as qparity names it. --stock
keeps transformers' own behaviour, which is what users' float64 runs get (about 1e-6 from fp64).

Usage: hf_reference.py --model DIR (--tokens 1,2,3 | --tokens-from TRACE.safetensors) --out F
       [--pixels F] [--stock]
"""
import argparse
import contextlib
import inspect
import sys

import torch
from safetensors.torch import load_file, save_file


@contextlib.contextmanager
def float_is_double(enabled, float32_too=False):
    """While active, torch.float and Tensor.float() mean float64 (rotary, router softmax); with
    float32_too also torch.float32 (Qwen3.5's Gated DeltaNet casts with .to(torch.float32))."""
    if not enabled:
        yield
        return
    saved_alias, saved_method, saved_32 = torch.float, torch.Tensor.float, torch.float32
    torch.float = torch.float64
    torch.Tensor.float = torch.Tensor.double
    if float32_too:
        torch.float32 = torch.float64
    try:
        yield
    finally:
        torch.float, torch.Tensor.float, torch.float32 = saved_alias, saved_method, saved_32


def fp64_rmsnorm_forward(self, hidden_states):
    eps = getattr(self, "variance_epsilon", getattr(self, "eps", None))
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + eps))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens")
    ap.add_argument("--tokens-from", help="a `qparity trace` file: use its `tokens`")
    ap.add_argument("--out", required=True)
    ap.add_argument("--pixels", help="the prompt's images (image-text checkpoints)")
    ap.add_argument("--stock", action="store_true")
    a = ap.parse_args()
    if bool(a.tokens) == bool(a.tokens_from):
        sys.exit("give exactly one of --tokens, --tokens-from")
    tokens = (torch.tensor([int(t) for t in a.tokens.split(",")]) if a.tokens else
              load_file(a.tokens_from)["tokens"].to(torch.int64))

    import json
    import os

    import transformers
    from transformers import AutoModelForCausalLM

    patched = not a.stock
    with open(os.path.join(a.model, "config.json")) as f:
        config = json.load(f)
    model_type = config.get("model_type", "")
    # An image-text checkpoint (Qwen3VLForConditionalGeneration, Qwen3_5ForConditionalGeneration):
    # built as its own class, run on text only (no pixel_values), its language model hooked.
    image_text = "text_config" in config
    if a.pixels and not image_text:
        sys.exit(f"hf_reference: --pixels needs an image-text checkpoint, {a.model} is not one")
    # The vision tower builds its position weights in an explicit float32 (transformers 5.17).
    # gpt-oss: YaRN's ramp is built with an explicit dtype=torch.float32.
    f32 = model_type in ("qwen3_5_text", "qwen3_5", "gpt_oss") or bool(a.pixels)
    # Qwen3.5 (hybrid Gated DeltaNet): its casts are .float() and .to(torch.float32); its
    # zero-centred RMSNorm ((1 + w) * x̂) is fp64 once those are, so it is not replaced below.
    hybrid = model_type in ("qwen3_5_text", "qwen3_5")
    loader = (getattr(transformers, config["architectures"][0]) if image_text
              else AutoModelForCausalLM)
    # Experts through transformers' eager per-expert loop: the default grouped_mm path has no
    # float64 kernel (and is not deterministic across batch shapes).
    # gpt-oss has no sdpa path (its sinks): transformers' eager attention.
    attn = "eager" if model_type == "gpt_oss" else "sdpa"
    extra = {}
    qc = config.get("quantization_config") or {}
    if qc.get("quant_method") == "mxfp4":
        # transformers' own MXFP4 reader (integrations/mxfp4.py), dequantizing the experts: an
        # independent check of the blocks' nibble order, the interleave and the transpose.
        from transformers import Mxfp4Config
        extra["quantization_config"] = Mxfp4Config(dequantize=True)
    with float_is_double(patched, f32):
        try:
            model, info = loader.from_pretrained(
                a.model, dtype=torch.float64, attn_implementation=attn,
                experts_implementation="eager", output_loading_info=True, **extra)
        except TypeError:  # transformers without the option (4.x): experts are a loop already
            model, info = loader.from_pretrained(a.model, dtype=torch.float64,
                                                 attn_implementation=attn,
                                                 output_loading_info=True, **extra)
    if extra:  # the dequantized experts must be float64 here (bf16 holds e2m1 * 2^k exactly)
        for name, prm in model.named_parameters():
            if prm.dtype != torch.float64:
                prm.data = prm.data.to(torch.float64)
    # A parameter transformers did not find is randomly initialized: the peer would compare
    # against noise. Every tensor must load, and nothing may be left over.
    bad = {k: sorted(v)[:8] for k, v in info.items()
           if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:
        sys.exit(f"hf_reference: {a.model} does not load cleanly into "
                 f"{type(model).__name__}: {bad}")
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")
    model.eval()
    if patched:
        for m in model.modules():
            if type(m).__name__.endswith("RMSNorm") and not hybrid:
                m.forward = fp64_rmsnorm_forward.__get__(m)
        for m in model.modules():  # inv_freq built before the patch took effect anywhere?
            # (the vision tower's rotary is not run on text)
            name = type(m).__name__
            if name.endswith("RotaryEmbedding") and "Vision" not in name:
                assert m.inv_freq.dtype == torch.float64, "rotary inv_freq is not float64"

    out = {}
    n_tokens = len(tokens)

    def record(name, t):  # [1, T, ...] or [T * heads, d] -> [T, everything else]
        out[name] = t.detach().reshape(n_tokens, -1).to(torch.float64).clone()

    def keep(name):
        def hook(_module, _inputs, output):
            record(name, output[0] if isinstance(output, tuple) else output)
        return hook

    def keep_input(name):  # a module's first input (forward pre-hook)
        def hook(_module, inputs):
            record(name, inputs[0])
        return hook

    base = model.model.language_model if image_text else model.model
    # embed: what layer 0 reads (an image prompt's placeholders already replaced by the images).
    base.layers[0].register_forward_pre_hook(keep_input("embed"))
    for i, layer in enumerate(base.layers):
        p = f"layers.{i}"
        layer.input_layernorm.register_forward_hook(keep(p + ".input_norm"))
        if hasattr(layer, "linear_attn"):  # Qwen3.5 Gated DeltaNet layer
            la = layer.linear_attn
            la.register_forward_hook(keep(p + ".attn.out"))
            la.norm.register_forward_pre_hook(keep_input(p + ".linear_attn.core"))
            la.norm.register_forward_hook(keep(p + ".linear_attn.norm"))
        else:
            layer.self_attn.register_forward_hook(keep(p + ".attn.out"))
            if hybrid:  # gated attention: o_proj reads core * sigmoid(gate)
                layer.self_attn.o_proj.register_forward_pre_hook(keep_input(p + ".attn.gated"))
        layer.post_attention_layernorm.register_forward_hook(keep(p + ".post_attn_norm"))
        sparse = hasattr(layer.mlp, "experts")
        layer.mlp.register_forward_hook(keep(p + (".moe.out" if sparse else ".mlp.out")))
    base.norm.register_forward_hook(keep("final_norm"))
    # layers.<i>.residual: the stream the next layer reads (after a deepstack injection).
    for i in range(len(base.layers) - 1):
        base.layers[i + 1].register_forward_pre_hook(keep_input(f"layers.{i}.residual"))
    base.norm.register_forward_pre_hook(keep_input(f"layers.{len(base.layers) - 1}.residual"))

    kwargs = {}
    if a.pixels:
        px = load_file(a.pixels)
        kwargs = dict(pixel_values=px["pixel_values"].to(torch.float64),
                      image_grid_thw=px["image_grid_thw"].to(torch.int64))
        # transformers 5.x finds the image runs by token type (the processor's mm_token_type_ids).
        if "mm_token_type_ids" in inspect.signature(model.model.get_rope_index).parameters:
            kwargs["mm_token_type_ids"] = (tokens[None, :] == config["image_token_id"]).to(torch.int32)
        visual = model.model.visual

        def keep_visual(name, first_input=False):
            def hook(_m, inputs, output=None):
                t = inputs[0] if first_input else (output[0] if isinstance(output, tuple) else output)
                out[name] = t.detach().reshape(t.shape[-2], t.shape[-1]).to(torch.float64).clone()
            return hook

        visual.blocks[0].register_forward_pre_hook(keep_visual("visual.embed", True))
        for i, blk in enumerate(visual.blocks):
            blk.register_forward_hook(keep_visual(f"visual.blocks.{i}.out"))

        def keep_tower(_m, _i, result):
            merged, deepstack = (result[0], result[1]) if isinstance(result, tuple) else (
                result.pooler_output if hasattr(result, "pooler_output") else result.last_hidden_state,
                getattr(result, "deepstack_features", None) or [])
            out["visual.merger"] = merged.detach().to(torch.float64).clone()
            for j, d in enumerate(deepstack):
                out[f"visual.deepstack.{j}"] = d.detach().to(torch.float64).clone()
        visual.register_forward_hook(keep_tower)

    saved_default = torch.get_default_dtype()
    if patched and a.pixels:  # torch.linspace in the position interpolation
        torch.set_default_dtype(torch.float64)
    try:
        with torch.no_grad(), float_is_double(patched, f32):
            logits = model(input_ids=tokens[None, :], use_cache=False, **kwargs).logits
    finally:
        torch.set_default_dtype(saved_default)
    out["logits"] = logits[0].to(torch.float64).clone()
    out["tokens"] = tokens.clone()
    save_file(out, a.out, metadata={"producer": "tools/peers/hf_reference.py",
                                    "mode": "stock" if a.stock else "fp64-patched"})
    print(f"hf_reference: {len(tokens)} tokens, {len(out) - 1} capture points -> {a.out}")


if __name__ == "__main__":
    main()
