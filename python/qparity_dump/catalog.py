"""The capture-point catalog (core/capture/capture_points.h, golden/SCHEMA.md): canonical names,
execution order and widths. A candidate's points must use these names to be compared. The names
and their order come from _points.py, which `qparity catalog --python` generates from the C++
catalog (a test keeps the two equal); the widths need a config and are computed here."""

from ._points import (AFTER_LAYERS, BEFORE_LAYERS, CODE_LEAVES, CODE_LINEARS,  # noqa: F401
                      LAYER_POINTS)
from ._points import LAYER_SUFFIXES as _ALL_SUFFIXES

# The codes an activation-quantized linear's GEMM was fed ("layers.<i>.attn.qkv_proj.x_values",
# [T, K], the decoded code values) and their scales (".x_scales", one row per token).
CODE_SUFFIXES = [f"{lin}.{leaf}" for lin in CODE_LINEARS for leaf in CODE_LEAVES]
# Every suffix a decoder layer's point can have, in execution order of a layer that had them all
# (the activation codes apart: CODE_SUFFIXES).
LAYER_SUFFIXES = [s for s in _ALL_SUFFIXES if s not in CODE_SUFFIXES]


def layer_points(layer, qk_norm=False, moe=False, kv_cache=False, linear_attention=False,
                 attn_gate=False):
    """The points of one decoder layer, "layers.<i>.<suffix>", in execution order (a Gated
    DeltaNet layer has no q/k norm, KV-cache or gate points, as core's layer_shape says)."""
    if linear_attention:
        qk_norm = kv_cache = attn_gate = False
    key = (bool(qk_norm), bool(moe), bool(kv_cache), bool(linear_attention), bool(attn_gate))
    return [f"layers.{layer}.{x}" for x in LAYER_POINTS[key]]


class ModelShape:
    """What the catalog needs from a Hugging Face config.json (a dict)."""

    def __init__(self, config):
        self.architecture = (config.get("architectures") or ["?"])[0]
        # An image-text class keeps its language model's config under text_config.
        config = {**config, **(config.get("text_config") or {})}
        self.hidden = int(config["hidden_size"])
        self.num_layers = int(config["num_hidden_layers"])
        self.num_heads = int(config["num_attention_heads"])
        self.num_kv_heads = int(config.get("num_key_value_heads") or self.num_heads)
        self.head_dim = int(config.get("head_dim") or self.hidden // self.num_heads)
        self.vocab = int(config["vocab_size"])
        self.intermediate = int(config.get("intermediate_size") or 0)
        # transformers 5.x writes num_local_experts where 4.x and the Hub's configs say num_experts
        self.num_experts = int(config.get("num_experts") or config.get("num_local_experts") or 0)
        self.top_k = int(config.get("num_experts_per_tok") or 0)
        self.moe_intermediate = int(config.get("moe_intermediate_size") or 0)
        self.qk_norm = self.architecture.startswith("Qwen3")
        # Qwen3.5: Gated DeltaNet layers (layer_types, else every full_attention_interval-th
        # layer is full attention) beside gated full attention (attn_output_gate, always on).
        qwen35 = self.architecture.startswith("Qwen3_5")
        types = config.get("layer_types")
        if types is None and qwen35:
            interval = int(config.get("full_attention_interval") or 4)
            types = ["linear_attention" if (i + 1) % interval else "full_attention"
                     for i in range(self.num_layers)]
        self._linear = [t == "linear_attention" for t in (types or [])] or \
            [False] * self.num_layers
        self.attn_gate = qwen35
        self.linear_key_heads = int(config.get("linear_num_key_heads") or 16)
        self.linear_value_heads = int(config.get("linear_num_value_heads") or 32)
        self.linear_key_head_dim = int(config.get("linear_key_head_dim") or 128)
        self.linear_value_head_dim = int(config.get("linear_value_head_dim") or 128)
        step = int(config.get("decoder_sparse_step") or 1)
        dense_only = set(config.get("mlp_only_layers") or [])
        self._moe = [self.num_experts > 0 and i not in dense_only and (i + 1) % step == 0
                     for i in range(self.num_layers)]

    def is_moe_layer(self, layer):
        return self._moe[layer]

    def is_linear_attention_layer(self, layer):
        return self._linear[layer]

    def check_moe_layers(self, moe_layers, where):
        """The model's own layout (which layers run experts) must be what config.json says:
        the reference builds the golden from config.json."""
        if len(moe_layers) != self.num_layers or list(moe_layers) != self._moe:
            raise ValueError(f"{where}: config.json makes layers "
                             f"{[i for i, m in enumerate(self._moe) if m]} MoE, the model runs "
                             f"experts in layers {[i for i, m in enumerate(moe_layers) if m]}")

    @property
    def q_size(self):
        return self.num_heads * self.head_dim

    @property
    def kv_size(self):
        return self.num_kv_heads * self.head_dim

    def points(self, kv_cache=False):
        """Every capture point of the model, in execution order."""
        out = list(BEFORE_LAYERS)
        for i in range(self.num_layers):
            out += layer_points(i, self.qk_norm, self.is_moe_layer(i), kv_cache,
                                self.is_linear_attention_layer(i), self.attn_gate)
        return out + AFTER_LAYERS

    def width(self, point):
        """The width (columns per token) the golden has for `point`."""
        if point in ("embed", "final_norm"):
            return self.hidden
        if point == "logits":
            return self.vocab
        layer = int(point.split(".")[1])
        suffix = point.split(".", 2)[2]
        del layer  # dense layers of a MoE model use intermediate_size too
        key_dim = self.linear_key_heads * self.linear_key_head_dim
        value_dim = self.linear_value_heads * self.linear_value_head_dim
        conv_dim = 2 * key_dim + value_dim
        q_proj = self.q_size * (2 if self.attn_gate else 1)  # q and its gate, per head
        return {
            "input_norm": self.hidden, "attn.qkv": q_proj + 2 * self.kv_size,
            "attn.gated": self.q_size, "linear_attn.qkvz": conv_dim + value_dim,
            "linear_attn.ba": 2 * self.linear_value_heads, "linear_attn.conv": conv_dim,
            "linear_attn.beta": self.linear_value_heads,
            "linear_attn.decay": self.linear_value_heads, "linear_attn.core": value_dim,
            "linear_attn.state": self.linear_value_heads * self.linear_key_head_dim *
            self.linear_value_head_dim, "linear_attn.norm": value_dim,
            "attn.q_norm": self.q_size, "attn.k_norm": self.kv_size, "attn.rope_q": self.q_size,
            "attn.rope_k": self.kv_size, "attn.k_cache": self.kv_size,
            "attn.v_cache": self.kv_size, "attn.core": self.q_size, "attn.out": self.hidden,
            "post_attn_norm": self.hidden, "mlp.gate_up": 2 * self.intermediate,
            "mlp.act": self.intermediate, "mlp.out": self.hidden,
            "moe.router_logits": self.num_experts, "moe.topk_ids": self.top_k,
            "moe.topk_weights": self.top_k, "moe.expert_out": self.top_k * self.hidden,
            "moe.out": self.hidden, "residual": self.hidden,
        }[suffix]


def order_of(points):
    """Sorts point names by execution order (catalog order; unknown names last, by name)."""
    def key(name):
        if name in BEFORE_LAYERS:
            return (0, 0, 0, name)
        if name in AFTER_LAYERS:
            return (2, 0, AFTER_LAYERS.index(name), name)
        parts = name.split(".", 2)
        if len(parts) == 3 and parts[0] == "layers" and parts[1].isdigit():
            sfx = parts[2]
            # The C++ catalog's order, activation codes included.
            rank = _ALL_SUFFIXES.index(sfx) if sfx in _ALL_SUFFIXES else len(_ALL_SUFFIXES)
            return (1, int(parts[1]), rank, name)
        return (3, 0, 0, name)
    return sorted(points, key=key)
