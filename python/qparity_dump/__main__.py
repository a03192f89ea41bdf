"""python -m qparity_dump hf --model DIR --tokens FILE --out CAND.h5 [--dtype bf16]
[--device cuda] [--seq-len T] [--batch B] [--attn sdpa] [--scheme ID] [--dialect D] [--force]

--tokens: token ids separated by whitespace or commas (cut into sequences of --seq-len; one
sequence without it), or a qparity golden (.h5), whose inputs/tokens are used as they are."""
import argparse
import os
import sys

from .tokens import read_tokens
from .writer import DIALECTS, CandidateError


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m qparity_dump")
    sub = ap.add_subparsers(dest="engine", required=True)
    hf = sub.add_parser("hf", help="Hugging Face transformers")
    hf.add_argument("--model", required=True, help="checkpoint directory")
    hf.add_argument("--tokens", required=True, help="token-id file or a golden .h5")
    hf.add_argument("--out", required=True, help="candidate file to write")
    hf.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    hf.add_argument("--device", default="cuda")
    hf.add_argument("--seq-len", type=int, default=0)
    hf.add_argument("--batch", type=int, default=8, help="sequences per forward call")
    hf.add_argument("--attn", default="sdpa", help="attn_implementation (sdpa, eager, ...)")
    hf.add_argument("--scheme", help="scheme id (default: from config.json)")
    hf.add_argument("--dialect", default="ideal", choices=DIALECTS)
    hf.add_argument("--force", action="store_true", help="replace an existing --out")
    a = ap.parse_args(argv)
    # Checked before any model is loaded: a missing output directory is one line, not a
    # traceback after minutes of forward passes.
    out_dir = os.path.dirname(os.path.abspath(a.out))
    if not os.path.isdir(out_dir):
        print(f"qparity_dump: {a.out}: the directory {out_dir} does not exist", file=sys.stderr)
        return 1
    try:
        tokens = read_tokens(a.tokens, a.seq_len)
        from . import hf as hf_engine
        out, shape = hf_engine.run(a, tokens)
    except ImportError as e:
        print(f"qparity_dump: the hf engine needs torch and transformers ({e}); "
              f"pip install torch transformers", file=sys.stderr)
        return 1
    except (CandidateError, ValueError, OSError) as e:
        print(f"qparity_dump: {e}", file=sys.stderr)
        return 1
    print(f"qparity_dump: {shape[0]}x{shape[1]} tokens -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
