"""SGLang (LlamaForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM), documented: the model is
`engine.tp_worker.worker.model_runner.model` (TP 1, --disable-cuda-graph). The layout SGLang
shares with vLLM is in fused_engines.py; SGLang's own: the Qwen3-MoE block's TopK module
returns (topk_weights, topk_ids, router_logits), exposing the routing."""
from . import fused_engines as fe
from .base import EngineMap, Tap

SGLANG = EngineMap(
    "sglang", fe.MODEL_TAPS,
    fe.LAYER_TAPS + [
        Tap("moe.topk_weights", fe.L + ".mlp.topk", take="output[0]", when="moe"),
        Tap("moe.topk_ids", fe.L + ".mlp.topk", take="output[1]", when="moe"),
    ],
    fe.ABSENT, fe.__doc__ + "\n" + __doc__)
