"""The module layout vLLM and SGLang share for Llama, Qwen3 and Qwen3-MoE: fused qkv_proj and
gate_up_proj (outputs [q|k|v] and [gate|up]; regather TP shards with fused.py), linears
returning (output, bias), rotary_emb(positions, q, k) -> (q, k) token-major, the attention
module's output as attn.core, and decoder layers returning (hidden, residual), added by the next
layer's fused add-RMSNorm: `residual` is recorded as their sum (the bf16 rounding the fused
kernel's in-place add makes). Tokens arrive flattened [N, ...]: prefill each sequence whole, in
order, so that rows are sequence-major; run eager (CUDA graphs replay kernels without hooks)."""
from .base import Tap

L = "model.layers.{i}"

MODEL_TAPS = [Tap("embed", "model.embed_tokens"), Tap("final_norm", "model.norm")]

LAYER_TAPS = [
    Tap("input_norm", L + ".input_layernorm"),
    Tap("attn.qkv", L + ".self_attn.qkv_proj"),
    Tap("attn.q_norm", L + ".self_attn.q_norm", when="qk_norm"),
    Tap("attn.k_norm", L + ".self_attn.k_norm", when="qk_norm"),
    Tap("attn.rope_q", L + ".self_attn.rotary_emb", take="output[0]"),
    Tap("attn.rope_k", L + ".self_attn.rotary_emb", take="output[1]"),
    Tap("attn.core", L + ".self_attn.attn"),
    Tap("attn.out", L + ".self_attn.o_proj"),
    Tap("post_attn_norm", L + ".post_attention_layernorm"),
    Tap("mlp.gate_up", L + ".mlp.gate_up_proj", when="dense"),
    Tap("mlp.act", L + ".mlp.act_fn", when="dense"),
    Tap("mlp.out", L + ".mlp.down_proj", when="dense"),
    Tap("moe.router_logits", L + ".mlp.gate", when="moe"),
    Tap("moe.out", L + ".mlp.experts", when="moe"),
    Tap("residual", L, take="output:sum"),
]

ABSENT = {
    "logits": "the LogitsProcessor runs on the sampled positions only; dump()'s forward= must "
              "return every position's logits (the lm_head weight over the final_norm rows)",
    "attn.k_cache": "the paged cache is written inside the attention backend",
    "attn.v_cache": "the paged cache is written inside the attention backend",
    "moe.expert_out": "the fused MoE kernels compute all experts at once",
}
