#!/usr/bin/env python3
"""Regenerates fuzz/corpus/: small valid (and a few near-valid) inputs per fuzz target, so the
fuzzers start from deep inside each parser. Run from the repo root; output is committed."""
import json
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors(entries, metadata=None, pad=True):
    header, blobs, off = {}, b"", 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, nbytes in entries:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + nbytes]}
        blobs += bytes((i * 37) & 0xFF for i in range(nbytes))
        off += nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + blobs


t = "fuzz_safetensors_header"
put(t, "empty", safetensors([]))
put(t, "one_f32", safetensors([("w", "F32", [2, 3], 24)], {"format": "pt"}))
put(t, "mixed", safetensors([("a", "BF16", [4], 8), ("b", "F8_E4M3", [3], 3), ("c", "I64", [1], 8),
                             ("d", "F4", [4], 2), ("e", "F8_E8M0", [2], 2), ("f", "BOOL", [0], 0)]))
put(t, "unpadded", safetensors([("x", "I8", [5], 5)], pad=False))
put(t, "gap", safetensors([("x", "I8", [5], 5)])[:-1])

t = "fuzz_safetensors_index"
put(t, "two_shards", json.dumps({"metadata": {"total_size": 24}, "weight_map": {
    "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
put(t, "bad_shard", json.dumps({"weight_map": {"a": "../x.safetensors"}}))

t = "fuzz_model_config"
llama = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
         "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
         "vocab_size": 128256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
         "max_position_embeddings": 131072, "tie_word_embeddings": False,
         "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 8192, "rope_type": "llama3"},
         "torch_dtype": "bfloat16"}
put(t, "llama3", json.dumps(llama))
qwen3 = {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 1024, "intermediate_size": 3072,
         "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
         "num_hidden_layers": 28, "vocab_size": 151936, "rms_norm_eps": 1e-6,
         "rope_theta": 1000000.0, "max_position_embeddings": 40960, "tie_word_embeddings": True,
         "attention_bias": False, "torch_dtype": "bfloat16"}
put(t, "qwen3", json.dumps(qwen3))
moe = dict(qwen3, architectures=["Qwen3MoeForCausalLM"], hidden_size=2048, num_attention_heads=32,
           num_key_value_heads=4, num_hidden_layers=48, num_experts=128, num_experts_per_tok=8,
           moe_intermediate_size=768, intermediate_size=6144, norm_topk_prob=True,
           decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False)
put(t, "qwen3_moe", json.dumps(moe))
put(t, "yarn", json.dumps(dict(qwen3, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                      "original_max_position_embeddings": 32768})))

t = "fuzz_compressed_tensors_config"


def ct(groups, fmt, ignore=("lm_head",), kv=None):
    return json.dumps({"quant_method": "compressed-tensors", "format": fmt,
                       "quantization_status": "compressed", "config_groups": groups,
                       "ignore": list(ignore), "kv_cache_scheme": kv, "version": "0.12.0"})


w8a8 = {"group_0": {"targets": ["Linear"], "weights": {
    "num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False},
    "input_activations": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token",
                          "dynamic": True}}}
put(t, "w8a8_int8", ct(w8a8, "int-quantized", ignore=["lm_head", "re:.*mlp.gate$"]))
w4a16 = {"group_0": {"targets": ["Linear"], "weights": {
    "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}}}
put(t, "w4a16_g32", ct(w4a16, "pack-quantized", ignore=["lm_head", "re:.*mlp.gate$"]))
fp8_block = {"group_0": {"targets": ["Linear"], "weights": {
    "num_bits": 8, "type": "float", "symmetric": True, "strategy": "block",
    "block_structure": [128, 128]}, "input_activations": {
    "num_bits": 8, "type": "float", "symmetric": True, "strategy": "group", "group_size": 128,
    "dynamic": True}}}
put(t, "fp8_block", ct(fp8_block, "float-quantized", ignore=["lm_head", "re:.*mlp.gate$"]))
nvfp4 = {"group_0": {"targets": ["re:.*self_attn.*", "re:.*experts.*"], "weights": {
    "num_bits": 4, "type": "float", "symmetric": True, "strategy": "tensor_group",
    "group_size": 16, "scale_dtype": "torch.float8_e4m3fn"}, "input_activations": {
    "num_bits": 4, "type": "float", "symmetric": True, "strategy": "tensor_group",
    "group_size": 16, "dynamic": "local"}}}
put(t, "nvfp4", ct(nvfp4, "nvfp4-pack-quantized",
                   kv={"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True,
                       "dynamic": False}))
put(t, "preset", ct({"FP8_DYNAMIC": ["Linear"]}, "float-quantized", ignore=["lm_head", "re:.*gate$"]))
put(t, "fp8_hf", json.dumps({"quant_method": "fp8", "activation_scheme": "dynamic",
                             "weight_block_size": [128, 128]}))

t = "fuzz_msmodelslim_config"
# Names of the fuzz model (fuzz/fuzz_model.h): 2 layers, layer 0 dense, layer 1 with 4 experts.
def modules():
    for i in range(2):
        p = f"model.layers.{i}"
        for m in ("q_proj", "k_proj", "v_proj", "o_proj"):
            yield f"{p}.self_attn.{m}"
        if i == 0:
            for m in ("gate_proj", "up_proj", "down_proj"):
                yield f"{p}.mlp.{m}"
        else:
            yield f"{p}.mlp.gate"
            for e in range(4):
                for m in ("gate_proj", "up_proj", "down_proj"):
                    yield f"{p}.mlp.experts.{e}.{m}"
    yield "lm_head"


def description(kind, extra=(), group_size=0, kv=False):
    d = {"model_quant_type": kind, "version": "1.0.0", "group_size": group_size, "metadata": {},
         "optional": {}, "model.embed_tokens.weight": "FLOAT", "model.norm.weight": "FLOAT"}
    for i in range(2):
        d[f"model.layers.{i}.input_layernorm.weight"] = "FLOAT"
        d[f"model.layers.{i}.post_attention_layernorm.weight"] = "FLOAT"
        d[f"model.layers.{i}.self_attn.q_norm.weight"] = "FLOAT"
        d[f"model.layers.{i}.self_attn.k_norm.weight"] = "FLOAT"
    for m in modules():
        q = "FLOAT" if m == "lm_head" or m.endswith("mlp.gate") else kind
        d[m + ".weight"] = q
        if q != "FLOAT":
            for s in extra:
                d[m + "." + s] = q
    if kv:
        d["kv_cache_type"] = "C8"
        d["kv_quant_type"] = "C8"
        for i in range(2):
            for proj in ("k_proj", "v_proj"):
                for s in ("kv_cache_scale", "kv_cache_offset"):
                    d[f"model.layers.{i}.self_attn.{proj}.{s}"] = "C8"
    return json.dumps(d)


put(t, "w8a16_channel", description("W8A16", ["weight_scale", "weight_offset"]))
put(t, "w8a16_g32", description("W8A16", ["weight_scale", "weight_offset"], group_size=32))
put(t, "w8a8_c8", description("W8A8", ["input_scale", "input_offset", "deq_scale", "quant_bias"], kv=True))
put(t, "w8a8_dynamic", description("W8A8_DYNAMIC", ["weight_scale", "weight_offset"]))
put(t, "w8a8sc", description("W8A8SC", ["index", "info"]))
print("corpus written under", ROOT)
