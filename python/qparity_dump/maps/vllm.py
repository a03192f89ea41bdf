"""vLLM (LlamaForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM), documented: the model is
`llm.llm_engine.model_executor.driver_worker.model_runner.model` (tensor parallel size 1,
enforce_eager=True). The layout vLLM shares with SGLang is in fused_engines.py; vLLM's own:
FusedMoE selects experts inside its kernels, so the top-k ids and weights are not exposed."""
from . import fused_engines as fe
from .base import EngineMap

VLLM = EngineMap(
    "vllm", fe.MODEL_TAPS, fe.LAYER_TAPS,
    dict(fe.ABSENT, **{"moe.topk_ids": "FusedMoE selects experts inside its kernels",
                       "moe.topk_weights": "FusedMoE selects experts inside its kernels"}),
    fe.__doc__ + "\n" + __doc__)
