#!/usr/bin/env python3
"""Regenerates fuzz/corpus/: small valid (and a few near-valid) inputs per fuzz target, so the
fuzzers start from deep inside each parser. Run from the repo root; output is committed.
The golden seeds need h5py and numpy (Debian: python3-h5py, built on the system libhdf5)."""
import json
import os
import struct
import tempfile

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

t = "fuzz_golden_reader"
# Tiny goldens in golden/SCHEMA.md's layout, attribute types as golden_file.cpp writes them.
import h5py  # noqa: E402  (only this target needs it)
import numpy as np  # noqa: E402

META = [("producer", "qparity-reference"), ("producer_version", "0.1.0"), ("model", "fuzz"),
        ("architecture", "Qwen3MoeForCausalLM"), ("model_config_hash", "ab" * 32),
        ("checkpoint_hash", "cd" * 32), ("scheme", "fp8-block"), ("dialect", "ideal"),
        ("precision_mode", "exact"), ("input_set", "synthetic:1x3:seed=1"),
        ("device", "cpu-reference"), ("created", "2026-01-01T00:00:00Z")]


def point_values(rng, name, rows, width):
    if name.endswith(".topk_ids"):  # distinct expert ids per token, as exact integers
        return np.array([rng.permutation(4)[:width] for _ in range(rows)], dtype=np.float64)
    return rng.standard_normal((rows, width))


def golden(name, seqs=1, seq_len=3, vocab=8, points=(("embed", 4),), point_dtype="float64",
           quant_stats=(), chunked="all", libver="latest", fixed_strings=False, drop=(),
           logits_rows=None, schema_version=1, order_attr=True, meta=()):
    rng = np.random.default_rng(len(name))
    rows = seqs * seq_len
    tokens = rng.integers(0, vocab, (seqs, seq_len), dtype=np.int64)
    targets = np.concatenate([tokens[:, 1:], np.full((seqs, 1), -1, np.int64)], axis=1)
    logits = rng.standard_normal((rows if logits_rows is None else logits_rows, vocab))
    lp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    tlp = np.array([lp[r, k] if k >= 0 and r < len(lp) else np.nan
                    for r, k in enumerate(targets.reshape(-1))])
    nll = np.array([np.nanmean(-tlp[i * seq_len:(i + 1) * seq_len]) for i in range(seqs)])
    ftype = "<f4" if point_dtype == "float32" else "<f8"

    def dataset(parent, key, data, dtype):
        data = np.asarray(data, dtype=dtype)
        kw = {}
        # As write_dataset: whole rows, shuffle, gzip 4 ("points": the capture points only).
        if (chunked == "all" or (chunked == "points" and parent.name == "/points")) and data.size:
            kw = dict(chunks=data.shape, shuffle=True, compression="gzip", compression_opts=4)
        return parent.create_dataset(key, data=data, track_times=False, **kw)

    def group(parent, key):  # without timestamps, so regenerating gives the same bytes
        gcpl = h5py.h5p.create(h5py.h5p.GROUP_CREATE)
        gcpl.set_obj_track_times(False)
        return h5py.Group(h5py.h5g.create(parent.id, key.encode(), gcpl=gcpl))

    fd, tmp = tempfile.mkstemp(suffix=".h5")
    os.close(fd)
    fcpl = h5py.h5p.create(h5py.h5p.FILE_CREATE)
    fcpl.set_obj_track_times(False)  # the root group's timestamps
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    low = {None: h5py.h5f.LIBVER_EARLIEST, "v108": h5py.h5f.LIBVER_V18,
           "latest": h5py.h5f.LIBVER_LATEST}[libver]
    fapl.set_libver_bounds(low, h5py.h5f.LIBVER_LATEST)
    with h5py.File(h5py.h5f.create(tmp.encode(), h5py.h5f.ACC_TRUNC, fapl=fapl, fcpl=fcpl)) as f:
        if "schema_version" not in drop:
            f.attrs.create("schema_version", schema_version, dtype="<i4")
        for key, value in dict(META + [("point_dtype", point_dtype)] + list(meta)).items():
            if key in drop:
                continue
            if fixed_strings:
                f.attrs.create(key, np.bytes_(value))
            else:
                f.attrs[key] = value  # h5py: scalar variable-length UTF-8
        if "seed" not in drop:
            f.attrs.create("seed", 1, dtype="<u8")
        g = group(f, "inputs")
        dataset(g, "tokens", tokens, "<i8")
        dataset(g, "targets", targets, "<i8")
        g = group(f, "points")
        for i, (key, width) in enumerate(points):
            d = dataset(g, key, point_values(rng, key, rows, width), ftype)
            if order_attr:
                d.attrs.create("order", i, dtype="<i8")
        g = group(f, "outputs")
        dataset(g, "logits", logits, "<f8")
        dataset(g, "target_logprobs", tlp, "<f8")
        dataset(g, "sequence_nll", nll, "<f8")
        dataset(g, "sequence_ppl", np.exp(nll), "<f8")
        if quant_stats:
            g = group(f, "quant_stats")
            for i, (key, n) in enumerate(quant_stats):
                d = dataset(g, key, [64 * (i + 1), i, 2, 0][:n], "<i8")
                d.attrs.create("order", i, dtype="<i8")
    with open(tmp, "rb") as fh:
        data = fh.read()
    os.remove(tmp)
    assert len(data) < 20 * 1024, (name, len(data))  # keep the committed corpus small
    put("fuzz_golden_reader", name, data)


dense = (("embed", 4), ("layers.0.attn.rope_k", 4), ("layers.0.mlp.out", 4), ("final_norm", 4))
moe = (("embed", 4), ("layers.1.moe.topk_ids", 2), ("layers.1.moe.topk_weights", 2),
       ("layers.1.moe.expert_out", 8))
qs = (("layers.0.attn.qkv_proj", 4), ("layers.1.moe.experts.w13", 4))
# The writer's own format (HDF5's earliest: symbol-table groups, v1 B-tree chunk indexes) costs
# ~3 KB per chunked dataset: one seed keeps it with only its two points chunked; the others use
# libver latest (single-chunk indexes, compact groups) to stay small.
golden("earliest_format", points=dense[:2], libver=None, chunked="points")
golden("v108_chunked_point", points=dense[:1], libver="v108", chunked="points")
golden("dense_f64", points=dense)
golden("moe_f32_quant_stats", points=moe, point_dtype="float32", quant_stats=qs,
       meta=[("run", "layer-local")])
golden("fixed_strings_2x2", seqs=2, seq_len=2, points=dense[:2], chunked="none",
       fixed_strings=True, quant_stats=qs[:1], meta=[("input_set", "layer-local:fuzz")])
golden("no_points", points=())
# Near-valid: each fails one check of the reader.
golden("missing_seed", points=dense[:2], drop=("seed",))
golden("logits_wrong_rows", points=dense[:2], logits_rows=2)
golden("schema_v2", points=dense[:1], schema_version=2)
golden("quant_stats_len3", points=dense[:1], quant_stats=(("layers.0.attn.o_proj", 3),))
golden("point_without_order", points=dense[:2], order_attr=False)
golden("bad_run", points=dense[:1], meta=[("run", "half")])

t = "fuzz_policy"
REPO = os.path.dirname(os.path.dirname(ROOT))
POLICIES = next(p for p in (os.path.join(REPO, "policies"),  # moved from tests/accuracy/
                            os.path.join(REPO, "tests", "accuracy", "policies"))
                if os.path.isdir(p))
for scheme in ("bf16", "fp8-block", "w8a8-static", "nvfp4"):
    with open(os.path.join(POLICIES, scheme + ".json"), "rb") as f:
        put(t, scheme, f.read())
section = {"derivation": "d", "provenance": "p",
           "points": [{"match": "layers.*.moe.topk_ids", "max_mismatches": 0, "why": "w"},
                      {"match": "*", "max_rel_l2": 1e-3, "max_col_rel_l2": 2e-3,
                       "max_median_row_rel_l2": 5e-4, "max_abs": 0.5, "min_cosine": 0.99,
                       "max_deepgemm_diff": 1e-4}],
           "end_to_end": {"max_kld_upper": 1e-3, "min_top1_lower": 0.75,
                          "max_dln_ppl_upper": 0.01, "why": "w"},
           "point_gates_apply_to": ["layer-local"], "optional_points": ["*.moe.expert_out"]}
put(t, "every_key", json.dumps({"scheme": "fp8-block", "comment": "c", "format": section,
                                "engine": {"default": section, "sm90": section,
                                           "cpu-reference": dict(section, points=[])}}))
e2e_only = {"derivation": "d", "end_to_end": {"max_kld_upper": 1e-3}}
put(t, "minimal", json.dumps({"scheme": "bf16", "engine": {"default": e2e_only}}))


def near(name, **sec):  # a valid policy but for one key of its default section
    put(t, name, json.dumps({"scheme": "bf16", "engine": {"default": dict(e2e_only, **sec)}}))


put(t, "no_default", json.dumps({"scheme": "bf16", "engine": {"sm90": e2e_only}}))
put(t, "bad_device_key", json.dumps({"scheme": "bf16", "engine": {"default": e2e_only,
                                                                  "h100": e2e_only}}))
near("negative_bound", points=[{"match": "*", "max_abs": -1}])
near("fractional_count", points=[{"match": "*.moe.topk_ids", "max_mismatches": 0.5}])
near("unknown_key", end_to_end={"max_kld": 1})
near("e2e_not_object", end_to_end=[1])
near("bad_glob", points=[{"match": "[!a-z]*[", "max_rel_l2": 0}])
near("provenance_number", provenance=1)
near("why_object", points=[{"match": "embed", "max_abs": 1, "why": {}}])
# ---- fuzz_tokenizer: tokenizer.json, a NUL byte, then the text ------------------------------
t = "fuzz_tokenizer"


def byte_char(b):  # GPT-2's bytes_to_unicode
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + \
        list(range(0xAE, 0x100))
    if b in printable:
        return chr(b)
    return chr(256 + sum(1 for x in range(b) if x not in printable))


LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
          r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def tokenizer(extra=(), merges=(), pre=None, normalizer=None, post=None, added=()):
    vocab = {byte_char(b): b for b in range(256)}
    for i, tok in enumerate(extra):
        vocab[tok] = 256 + i
    if pre is None:
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]}
    return json.dumps({"version": "1.0", "added_tokens": list(added), "normalizer": normalizer,
                       "pre_tokenizer": pre, "post_processor": post, "decoder": None,
                       "model": {"type": "BPE", "dropout": None, "unk_token": None,
                                 "continuing_subword_prefix": None, "end_of_word_suffix": None,
                                 "fuse_unk": False, "byte_fallback": False,
                                 "ignore_merges": False, "vocab": vocab,
                                 "merges": [list(m) for m in merges]}})


G = byte_char(ord(" "))
bpe = tokenizer(extra=["he", "ll", "hell", "hello", G + "w", G + "wo"],
                merges=[("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), (G, "w"),
                        (G + "w", "o")])
put(t, "llama3_split", bpe + "\0hello world, HELLO 123456 it's\n\n  x")
put(t, "byte_level_regex", tokenizer(pre={"type": "ByteLevel", "add_prefix_space": True,
                                          "trim_offsets": True, "use_regex": True})
    + "\0caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \U0001F600")
bos = {"type": "TemplateProcessing",
       "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                  {"Sequence": {"id": "A", "type_id": 0}}], "pair": [],
       "special_tokens": {"<s>": {"id": "<s>", "ids": [300], "tokens": ["<s>"]}}}
put(t, "added_and_bos", tokenizer(added=[{"id": 300, "content": "<s>", "special": True},
                                         {"id": 301, "content": "<|eot|>", "special": True}],
                                  post=bos) + "\0a<|eot|>b<s>c")
put(t, "nfc", tokenizer(normalizer={"type": "NFC"}) + "\0e\xcc\x81 A\xcc\x8a")
put(t, "json_only", bpe)
put(t, "bad_merge", tokenizer(merges=[("a", "b")]) + "\0ab")
print("corpus written under", ROOT)
