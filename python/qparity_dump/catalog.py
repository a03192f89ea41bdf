"""The capture-point catalog (core/capture/capture_points.h, golden/SCHEMA.md): canonical names,
execution order and widths. A candidate's points must use these names to be compared."""

BEFORE_LAYERS = ["embed"]
AFTER_LAYERS = ["final_norm", "logits"]

# Every suffix a decoder layer's point can have, in execution order of a layer that had them all.
ATTENTION_SUFFIXES = ["input_norm", "attn.qkv", "attn.q_norm", "attn.k_norm", "attn.rope_q",
                      "attn.rope_k", "attn.k_cache", "attn.v_cache", "attn.core", "attn.out",
                      "post_attn_norm"]
DENSE_SUFFIXES = ["mlp.gate_up", "mlp.act", "mlp.out"]
MOE_SUFFIXES = ["moe.router_logits", "moe.topk_ids", "moe.topk_weights", "moe.expert_out",
                "moe.out"]
LAYER_SUFFIXES = ATTENTION_SUFFIXES + DENSE_SUFFIXES + MOE_SUFFIXES + ["residual"]
# The codes an activation-quantized linear's GEMM was fed ("layers.<i>.attn.qkv_proj.x_values",
# [T, K], the decoded code values) and their scales (".x_scales", one row per token).
CODE_LINEARS = ["attn.qkv_proj", "attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"]
CODE_SUFFIXES = [f"{lin}.{leaf}" for lin in CODE_LINEARS for leaf in ("x_values", "x_scales")]


def layer_points(layer, qk_norm=False, moe=False, kv_cache=False):
    """The points of one decoder layer, "layers.<i>.<suffix>", in execution order."""
    s = ["input_norm", "attn.qkv"]
    if qk_norm:
        s += ["attn.q_norm", "attn.k_norm"]
    s += ["attn.rope_q", "attn.rope_k"]
    if kv_cache:
        s += ["attn.k_cache", "attn.v_cache"]
    s += ["attn.core", "attn.out", "post_attn_norm"]
    s += MOE_SUFFIXES if moe else DENSE_SUFFIXES
    s.append("residual")
    return [f"layers.{layer}.{x}" for x in s]


class ModelShape:
    """What the catalog needs from a Hugging Face config.json (a dict)."""

    def __init__(self, config):
        self.architecture = (config.get("architectures") or ["?"])[0]
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
        step = int(config.get("decoder_sparse_step") or 1)
        dense_only = set(config.get("mlp_only_layers") or [])
        self._moe = [self.num_experts > 0 and i not in dense_only and (i + 1) % step == 0
                     for i in range(self.num_layers)]

    def is_moe_layer(self, layer):
        return self._moe[layer]

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
            out += layer_points(i, self.qk_norm, self.is_moe_layer(i), kv_cache)
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
        return {
            "input_norm": self.hidden, "attn.qkv": self.q_size + 2 * self.kv_size,
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
            before = {"attn.qkv_proj": "attn.qkv", "attn.o_proj": "attn.out",
                      "mlp.gate_up_proj": "mlp.gate_up", "mlp.down_proj": "mlp.out"}
            lin = sfx.rsplit(".", 1)[0]
            if lin in before:  # a linear's codes come just before its output
                rank = LAYER_SUFFIXES.index(before[lin]) - 0.5
            else:
                rank = LAYER_SUFFIXES.index(sfx) if sfx in LAYER_SUFFIXES else len(LAYER_SUFFIXES)
            return (1, int(parts[1]), rank, name)
        return (3, 0, 0, name)
    return sorted(points, key=key)
