"""Fused projections into the catalog's points. Works on numpy arrays and torch tensors alike
(slicing and concatenation along the last axis only).

The catalog's `attn.qkv` is q, k and v side by side per token ([q | k | v], q_size + 2 kv_size
wide) and `mlp.gate_up` is [gate | up]: what one unsharded QKVParallelLinear /
MergedColumnParallelLinear (vLLM, SGLang) computes. Under tensor parallelism each rank holds
[q_r | k_r | v_r] (its heads) and [gate_r | up_r] (its slice of the intermediate dimension);
the canonical point is the ranks' parts regathered: [q_0 .. q_n | k_0 .. k_n | v_0 .. v_n].
"""


def _cat(parts):
    first = parts[0]
    if hasattr(first, "new_empty"):  # a torch tensor
        import torch
        return torch.cat(parts, dim=-1)
    import numpy as np
    return np.concatenate(parts, axis=-1)


def _width(x):
    return x.shape[-1]


def split_qkv(qkv, q_size, kv_size):
    """[q | k | v] -> (q, k, v); the width must be q_size + 2 kv_size."""
    if _width(qkv) != q_size + 2 * kv_size:
        raise ValueError(f"qkv width {_width(qkv)} != q_size {q_size} + 2 * kv_size {kv_size}")
    return qkv[..., :q_size], qkv[..., q_size:q_size + kv_size], qkv[..., q_size + kv_size:]


def join_qkv(q, k, v):
    """(q, k, v) -> the catalog's attn.qkv [q | k | v]."""
    return _cat([q, k, v])


def split_gate_up(gate_up, intermediate):
    """[gate | up] -> (gate, up); the width must be 2 * intermediate."""
    if _width(gate_up) != 2 * intermediate:
        raise ValueError(f"gate_up width {_width(gate_up)} != 2 * intermediate {intermediate}")
    return gate_up[..., :intermediate], gate_up[..., intermediate:]


def gather_qkv_shards(shards, num_heads, num_kv_heads, head_dim):
    """Per-rank qkv_proj outputs [q_r | k_r | v_r] (rank order) -> the unsharded [q | k | v].

    Ranks hold num_heads / tp query heads each; with tp > num_kv_heads each KV head is replicated
    on tp / num_kv_heads consecutive ranks (vLLM's and SGLang's QKVParallelLinear), and one copy
    of each is kept."""
    tp = len(shards)
    if tp == 0 or num_heads % tp:
        raise ValueError(f"{num_heads} query heads do not split over {tp} ranks")
    if tp > num_kv_heads and tp % num_kv_heads:
        raise ValueError(f"{num_kv_heads} KV heads cannot be replicated over {tp} ranks")
    if tp <= num_kv_heads and num_kv_heads % tp:
        raise ValueError(f"{num_kv_heads} KV heads do not split over {tp} ranks")
    q_r = num_heads // tp * head_dim
    kv_r = max(1, num_kv_heads // tp) * head_dim
    replicas = max(1, tp // num_kv_heads)
    qs, ks, vs = [], [], []
    for r, s in enumerate(shards):
        q, k, v = split_qkv(s, q_r, kv_r)
        qs.append(q)
        if r % replicas == 0:
            ks.append(k)
            vs.append(v)
    return _cat(qs + ks + vs)


def gather_gate_up_shards(shards, intermediate):
    """Per-rank gate_up_proj outputs [gate_r | up_r] -> the unsharded [gate | up]."""
    tp = len(shards)
    if tp == 0 or intermediate % tp:
        raise ValueError(f"intermediate {intermediate} does not split over {tp} ranks")
    gates, ups = zip(*(split_gate_up(s, intermediate // tp) for s in shards))
    return _cat(list(gates) + list(ups))


def gather_columns(shards):
    """Column-parallel outputs (attn.core, mlp.act under TP) -> the unsharded tensor."""
    return _cat(list(shards))
