"""qparity_dump: an engine's activations as a qparity candidate (golden schema v1).

numpy and h5py at import; torch only for the hooks (capture.dump, torch_hooks).

    import qparity_dump as qd
    cand = qd.Candidate.for_checkpoint(model_dir, tokens, producer="my-engine", scheme="bf16")
    cand.add_point("layers.0.attn.out", values)          # [S*T, width] or [S, T, width]
    cand.declare_absent("layers.*.attn.core", "fused attention kernel")
    cand.set_logits(logits)
    cand.write("candidate.h5")
"""
from .catalog import ModelShape, layer_points, order_of  # noqa: F401
from .checkpoint import checkpoint_hash, config_hash  # noqa: F401
from .fused import (gather_gate_up_shards, gather_qkv_shards, join_qkv,  # noqa: F401
                    split_gate_up, split_qkv)
from .recorder import Recorder  # noqa: F401
from .tokens import read_tokens  # noqa: F401
from .writer import Candidate, CandidateError  # noqa: F401

__version__ = "0.1.0"


def dump(*args, **kwargs):
    """capture.dump (imports torch)."""
    from .capture import dump as _dump
    return _dump(*args, **kwargs)
