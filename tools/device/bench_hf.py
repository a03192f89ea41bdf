#!/usr/bin/env python3
"""Hugging Face transformers on the same synthetic shapes as bench/bench_engine (random bf16
weights, same context / steps / batches), eager PyTorch on the same GPU, so the engine's numbers
have a peer measured in the same device session.

Decode: each batch prefilled with --context tokens (DynamicCache), then --steps greedy steps, one
token per sequence per step, timed with torch.cuda.synchronize() around the loop.
Prefill: one forward of 4 x 512 tokens (logits_to_keep=1), timed over 3 repetitions.

--compiled: the stronger peer the image allows instead: `generate` with
cache_implementation="static" (transformers then compiles the decoding forward with torch.compile
and replays it through CUDA graphs), greedy, --prompt tokens + --new tokens per sequence at
batches 1 and 8, two warm-up runs (compilation, graph capture) before the timed one. Reported as
new tokens / wall time of the timed generate call (its prefill included), and ms per new token.
The eager peer above has neither compilation nor warm-up, which flatters small batches.
Usage: bench_hf.py --json OUT [--context 512 --steps 64 --models qwen3-0.6b,llama3-8b]
       bench_hf.py --compiled --json OUT [--prompt 128 --new 128 --models ...]
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config


def shapes(name):
    if name == "qwen3-0.6b":
        return Qwen3Config(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                           num_key_value_heads=8, head_dim=128, intermediate_size=3072,
                           vocab_size=151936, rms_norm_eps=1e-6, rope_theta=1000000,
                           tie_word_embeddings=True, max_position_embeddings=40960)
    if name == "llama3-8b":
        return LlamaConfig(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                           num_key_value_heads=8, head_dim=128, intermediate_size=14336,
                           vocab_size=128256, rms_norm_eps=1e-5, rope_theta=500000,
                           rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 8192},
                           max_position_embeddings=131072, tie_word_embeddings=False)
    raise SystemExit(f"unknown model {name}")


@torch.inference_mode()
def bench(name, context, steps):
    cfg = shapes(name)
    torch.manual_seed(0)
    with torch.device("cuda"):  # initialize on the GPU: an 8B model's CPU init takes minutes
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    out = {"model": name, "decode": []}
    for batch in (1, 8, 64):
        ids = torch.randint(0, cfg.vocab_size, (batch, context), device="cuda")
        r = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        cache = r.past_key_values
        nxt = r.logits[:, -1].argmax(-1, keepdim=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            r = model(input_ids=nxt, past_key_values=cache, use_cache=True)
            cache = r.past_key_values
            nxt = r.logits[:, -1].argmax(-1, keepdim=True)
        torch.cuda.synchronize()
        secs = time.perf_counter() - t0
        tps = batch * steps / secs
        out["decode"].append({"batch": batch, "tokens_per_s": tps, "ms_per_step": secs / steps * 1e3})
        print(f"HF {name} decode batch {batch}: {tps:.1f} tokens/s, {secs / steps * 1e3:.2f} ms/step",
              flush=True)
        del cache, r
        torch.cuda.empty_cache()
    ids = torch.randint(0, cfg.vocab_size, (4, 512), device="cuda")
    model(input_ids=ids, logits_to_keep=1)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):
        model(input_ids=ids, logits_to_keep=1)
    torch.cuda.synchronize()
    tps = 3 * ids.numel() / (time.perf_counter() - t0)
    out["prefill"] = {"tokens": ids.numel(), "tokens_per_s": tps}
    print(f"HF {name} prefill {ids.numel()} tokens: {tps:.0f} tokens/s", flush=True)
    del model
    torch.cuda.empty_cache()
    return out


@torch.inference_mode()
def bench_compiled(name, prompt, new):
    cfg = shapes(name)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    gc = model.generation_config
    gc.eos_token_id = None  # random weights: never stop early
    gc.pad_token_id = 0
    out = {"model": name, "peer": "generate, static cache, compiled", "generate": []}
    for batch in (1, 8):
        ids = torch.randint(1, cfg.vocab_size, (batch, prompt), device="cuda")
        mask = torch.ones_like(ids)

        def run():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            r = model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                               max_new_tokens=new, min_new_tokens=new,
                               cache_implementation="static")
            torch.cuda.synchronize()
            assert r.shape[1] == prompt + new, r.shape
            return time.perf_counter() - t0

        warm = [run(), run()]
        secs = run()
        tps = batch * new / secs
        out["generate"].append({"batch": batch, "prompt": prompt, "new": new,
                                "tokens_per_s": tps, "ms_per_new_token": secs / new * 1e3,
                                "warmup_s": warm})
        print(f"HF compiled {name} generate batch {batch} ({prompt} + {new}): {tps:.1f} new "
              f"tokens/s, {secs / new * 1e3:.2f} ms per step (warm-up {warm[0]:.1f} s, "
              f"{warm[1]:.2f} s)", flush=True)
    del model
    torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--models", default="qwen3-0.6b,llama3-8b")
    ap.add_argument("--compiled", action="store_true")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    a = ap.parse_args()
    import transformers
    runs = [bench_compiled(m, a.prompt, a.new) if a.compiled else bench(m, a.context, a.steps)
            for m in a.models.split(",")]
    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "transformers": transformers.__version__, "models": runs}
    with open(a.json, "w") as f:
        json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
