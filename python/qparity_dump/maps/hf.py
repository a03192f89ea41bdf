"""Hugging Face transformers: LlamaForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM (4.x and
5.x module layouts).

Every projection is its own nn.Linear, so q, k, v and gate, up are concatenated into the
catalog's fused points. Rotary is a function (apply_rotary_pos_emb of the model's module), not a
module: the hooks wrap it while the dump runs ("call:" taps) and attribute each call to the
attention module running it; its outputs are heads-first [B, H, T, D]. The MoE router differs by
version: 4.x's `gate` is an nn.Linear giving the logits, with top-k computed inline (not
exposed); 5.x's Qwen3MoeTopKRouter returns (softmax probabilities, top-k weights, top-k ids), so
the ids and weights are exposed but the pre-softmax logits are not. The fused expert stacks do
not expose per-expert outputs.
"""
from .base import EngineMap, Tap

_L = "model.layers.{i}"

_COMMON = [
    Tap("input_norm", _L + ".input_layernorm"),
    Tap("attn.qkv", _L + ".self_attn.q_proj", part=(0, 3)),
    Tap("attn.qkv", _L + ".self_attn.k_proj", part=(1, 3)),
    Tap("attn.qkv", _L + ".self_attn.v_proj", part=(2, 3)),
    Tap("attn.q_norm", _L + ".self_attn.q_norm", when="qk_norm"),
    Tap("attn.k_norm", _L + ".self_attn.k_norm", when="qk_norm"),
    Tap("attn.rope_q", _L + ".self_attn", take="call:apply_rotary_pos_emb[0]",
        transform="heads_first"),
    Tap("attn.rope_k", _L + ".self_attn", take="call:apply_rotary_pos_emb[1]",
        transform="heads_first"),
    Tap("attn.core", _L + ".self_attn.o_proj", take="input"),
    Tap("attn.out", _L + ".self_attn.o_proj"),
    Tap("post_attn_norm", _L + ".post_attention_layernorm"),
    Tap("mlp.gate_up", _L + ".mlp.gate_proj", part=(0, 2), when="dense"),
    Tap("mlp.gate_up", _L + ".mlp.up_proj", part=(1, 2), when="dense"),
    Tap("mlp.act", _L + ".mlp.down_proj", take="input", when="dense"),
    Tap("mlp.out", _L + ".mlp", when="dense"),
    Tap("moe.out", _L + ".mlp", when="moe"),
    Tap("residual", _L),
]
_MODEL = [Tap("embed", "model.embed_tokens"), Tap("final_norm", "model.norm"),
          Tap("logits", "lm_head")]
_ABSENT = {
    "attn.k_cache": "transformers' cache holds rope_k unquantized in the model dtype",
    "attn.v_cache": "transformers' cache holds v unquantized in the model dtype",
    "moe.expert_out": "the experts run as one fused module; per-expert outputs are not module "
                      "outputs",
}


def hf_map(router_returns_topk):
    """The map for a model whose MoE router returns (probabilities, weights, ids) (5.x) or the
    logits only (4.x, an nn.Linear)."""
    absent = dict(_ABSENT)
    if router_returns_topk:
        moe = [Tap("moe.topk_weights", _L + ".mlp.gate", take="output[1]", when="moe"),
               Tap("moe.topk_ids", _L + ".mlp.gate", take="output[2]", when="moe")]
        absent["moe.router_logits"] = ("transformers' Qwen3MoeTopKRouter returns softmax "
                                       "probabilities; the pre-softmax logits are not exposed")
    else:
        moe = [Tap("moe.router_logits", _L + ".mlp.gate", when="moe")]
        absent["moe.topk_ids"] = "transformers 4.x computes top-k inline in the MoE block"
        absent["moe.topk_weights"] = "transformers 4.x computes top-k inline in the MoE block"
    return EngineMap("hf-transformers", _MODEL, _COMMON + moe, absent, __doc__)


HF_TRANSFORMERS = hf_map(router_returns_topk=True)
