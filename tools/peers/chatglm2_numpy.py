#!/usr/bin/env python3
"""An independent fp64 ChatGLM2 forward in numpy, the peer of qparity's reference for ChatGLM2
(whose modelling code is remote code, not in transformers). Written from the published
modelling file (THUDM/chatglm2-6b modeling_chatglm.py), reading the checkpoint under its own
names: it shares no code and no name mapping with qparity.

  x = word_embeddings[tokens]
  per layer: h = RMSNorm(x) (input_layernorm: x * rsqrt(mean(x^2) + eps) * w)
             [q | k | v] = h @ query_key_value.weight^T + query_key_value.bias
               (q: heads * kv_channels, k and v: multi_query_group_num * kv_channels)
             RoPE on the first kv_channels / 2 dims of each head, pairs (2i, 2i+1):
               theta_i = 1 / (10000 * rope_ratio) ** (2i / rot), angle = position * theta_i
               (o0, o1) = (x0 cos - x1 sin, x1 cos + x0 sin); the other half passes through
             head h attends with group h // (heads / groups), causal, scale 1 / sqrt(kv_channels)
             x = x + attn @ dense.weight^T
             h2 = RMSNorm(x) (post_attention_layernorm); m = h2 @ dense_h_to_4h.weight^T
             x = x + (silu(m[:, :ffn]) * m[:, ffn:]) @ dense_4h_to_h.weight^T
  logits = RMSNorm(x) (final_layernorm) @ output_layer.weight^T

Compares with a `qparity trace` file (its tokens, and the points both have: embed,
layers.<i>.{input_norm, attn.out, post_attn_norm, mlp.out, residual}, final_norm, logits) by
relative L2 per point; exit status 1 when any exceeds --bound or no point is shared.

Usage: chatglm2_numpy.py --model DIR --trace TRACE.safetensors [--bound 1e-12]
"""
import argparse
import glob
import json
import os
import struct
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        raw = np.frombuffer(data, dtype=np.uint8, count=e - b, offset=base + b)
        dt, shape = t["dtype"], t["shape"]
        if dt == "BF16":
            v = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        elif dt == "F16":
            v = raw.view(np.float16).astype(np.float64)
        elif dt == "F32":
            v = raw.view(np.float32).astype(np.float64)
        elif dt == "F64":
            v = raw.view(np.float64).copy()
        elif dt == "I64":
            v = raw.view(np.int64).copy()
        elif dt == "I32":
            v = raw.view(np.int32).astype(np.int64)
        else:
            sys.exit(f"{path}: tensor {name}: dtype {dt} not handled by the peer")
        out[name] = v.reshape(shape)
    return out


def rms_norm(x, w, eps):
    variance = np.mean(x * x, axis=-1, keepdims=True)
    return w * (x * (1.0 / np.sqrt(variance + eps)))


def forward(cfg, w, tokens):
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    hn = cfg.get("kv_channels") or hidden // heads
    groups = cfg["multi_query_group_num"] if cfg.get("multi_query_attention") else heads
    ffn, eps = cfg["ffn_hidden_size"], cfg.get("layernorm_epsilon", 1e-5)
    base = 10000.0 * cfg.get("rope_ratio", 1.0)
    rot = hn // 2
    theta = 1.0 / base ** (np.arange(0, rot, 2, dtype=np.float64) / rot)
    T = len(tokens)
    pos = np.arange(T, dtype=np.float64)
    ang = np.outer(pos, theta)  # [T, rot/2]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(x, nh):  # x [T, nh * hn]
        x = x.reshape(T, nh, hn).copy()
        r = x[:, :, :rot].reshape(T, nh, rot // 2, 2)
        x0, x1 = r[..., 0].copy(), r[..., 1].copy()
        r[..., 0] = x0 * cos - x1 * sin
        r[..., 1] = x1 * cos + x0 * sin
        x[:, :, :rot] = r.reshape(T, nh, rot)
        return x

    pts = {}
    x = w["transformer.embedding.word_embeddings.weight"][np.array(tokens)]
    pts["embed"] = x.copy()
    mask = np.tril(np.ones((T, T), dtype=bool))
    for i in range(cfg["num_layers"]):
        p = f"transformer.encoder.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        pts[f"layers.{i}.input_norm"] = h
        mixed = h @ w[p + "self_attention.query_key_value.weight"].T
        if p + "self_attention.query_key_value.bias" in w:
            mixed = mixed + w[p + "self_attention.query_key_value.bias"]
        q = rope(mixed[:, :heads * hn], heads)
        k = rope(mixed[:, heads * hn:(heads + groups) * hn], groups)
        v = mixed[:, (heads + groups) * hn:].reshape(T, groups, hn)
        ctx = np.empty((T, heads, hn))
        for hh in range(heads):
            g = hh // (heads // groups)
            s = (q[:, hh, :] @ k[:, g, :].T) / np.sqrt(float(hn))
            s = np.where(mask, s, -np.inf)
            s = np.exp(s - s.max(axis=1, keepdims=True))
            s = s / s.sum(axis=1, keepdims=True)
            ctx[:, hh, :] = s @ v[:, g, :]
        attn = ctx.reshape(T, heads * hn) @ w[p + "self_attention.dense.weight"].T
        pts[f"layers.{i}.attn.out"] = attn
        x = x + attn
        h2 = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        pts[f"layers.{i}.post_attn_norm"] = h2
        m = h2 @ w[p + "mlp.dense_h_to_4h.weight"].T
        a, b = m[:, :ffn], m[:, ffn:]
        y = ((a / (1.0 + np.exp(-a))) * b) @ w[p + "mlp.dense_4h_to_h.weight"].T
        pts[f"layers.{i}.mlp.out"] = y
        x = x + y
        pts[f"layers.{i}.residual"] = x.copy()
    f = rms_norm(x, w["transformer.encoder.final_layernorm.weight"], eps)
    pts["final_norm"] = f
    pts["logits"] = f @ w["transformer.output_layer.weight"].T
    return pts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--bound", type=float, default=1e-12)
    a = ap.parse_args()
    with open(os.path.join(a.model, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("model_type") != "chatglm":
        sys.exit(f"{a.model}: not a ChatGLM2 checkpoint (model_type {cfg.get('model_type')})")
    w = {}
    for path in sorted(glob.glob(os.path.join(a.model, "*.safetensors"))):
        w.update(read_safetensors(path))
    trace = read_safetensors(a.trace)
    tokens = [int(t) for t in trace["tokens"].reshape(-1)]
    ours = forward(cfg, w, tokens)
    worst, shared = 0.0, 0
    for name in sorted(ours):
        if name not in trace:
            continue
        shared += 1
        ref = trace[name].reshape(ours[name].shape)
        den = np.linalg.norm(ours[name])
        rel = np.linalg.norm(ref - ours[name]) / den if den > 0 else np.linalg.norm(ref)
        worst = max(worst, rel)
        print(f"{rel:10.3e}  {name}")
    print(f"{shared} common capture points, {len(tokens)} tokens, worst rel L2 {worst:.3e} "
          f"(bound {a.bound:g})")
    sys.exit(0 if shared > 0 and worst <= a.bound else 1)


if __name__ == "__main__":
    main()
