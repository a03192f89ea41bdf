"""Name maps for Hugging Face transformers, vLLM and SGLang model classes (see base.py)."""
from .base import EngineMap, Tap  # noqa: F401
from .hf import HF_TRANSFORMERS  # noqa: F401
from .sglang import SGLANG  # noqa: F401
from .vllm import VLLM  # noqa: F401

MAPS = {m.name: m for m in (HF_TRANSFORMERS, VLLM, SGLANG)}
