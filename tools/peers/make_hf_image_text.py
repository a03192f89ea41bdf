#!/usr/bin/env python3
"""Writes a tiny random-weight image-text checkpoint with transformers' own classes and
save_pretrained (run on the GPU image, which has transformers; never in CI), so that qparity's
reading of the wrapper layout is checked against what transformers itself writes: the nested
config (text_config, vision_config), the language model under model.language_model.*, the vision
tower under model.visual.*, lm_head (tied or not) at the top.

  qwen3-vl    Qwen3VLForConditionalGeneration: Qwen3-style text decoder with interleaved M-RoPE
              sections, tied embeddings (as the 2B / 4B models), a 2-block vision tower with a
              deepstack tap
  qwen3.5-vl  Qwen3_5ForConditionalGeneration: the hybrid Gated DeltaNet / gated attention
              decoder, untied

Every parameter gets seeded Gaussian noise on top of transformers' initialization, so zero or one
initializations (zero-centred norms, biases) do not hide a wrong fold. Weights are saved in
bfloat16, as the released checkpoints are (the peer's float64 patch aliases torch.float32 for
Qwen3.5, which an F32 file would not survive).

Usage: make_hf_image_text.py --arch qwen3-vl|qwen3.5-vl --out DIR [--seed N] [--manifest F]
  --manifest writes every saved tensor's name, shape and dtype as JSON (the layout a fixture
  writer must reproduce).
"""
import argparse

import torch


def text_config(arch):
    common = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=4096,
                  attention_bias=False)
    if arch == "qwen3-vl":
        # head_dim 16: 8 rotary frequencies split 3 / 3 / 2 among t / h / w.
        return dict(common, model_type="qwen3_vl_text", num_hidden_layers=3, head_dim=16,
                    rope_parameters={"rope_type": "default", "rope_theta": 5000000.0,
                                     "mrope_section": [3, 3, 2], "mrope_interleaved": True},
                    tie_word_embeddings=True)
    # head_dim 32, partial rotary 0.25: 8 rotary channels, 4 frequencies split 2 / 1 / 1.
    return dict(common, model_type="qwen3_5_text", num_hidden_layers=4, head_dim=32,
                layer_types=["linear_attention", "full_attention"] * 2,
                linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                linear_num_key_heads=2, linear_num_value_heads=4,
                rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                                 "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
                                 "mrope_interleaved": True},
                tie_word_embeddings=False)


def vision_config(arch):
    v = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
             patch_size=4, spatial_merge_size=2, temporal_patch_size=2, in_channels=3,
             num_position_embeddings=16)
    if arch == "qwen3-vl":
        v["deepstack_visual_indexes"] = [0]
    return v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", required=True, choices=["qwen3-vl", "qwen3.5-vl"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--manifest")
    a = ap.parse_args()

    from transformers import AutoConfig, AutoModelForImageTextToText

    torch.manual_seed(a.seed)
    model_type = "qwen3_vl" if a.arch == "qwen3-vl" else "qwen3_5"
    tc = text_config(a.arch)
    # Placeholder token ids the last four of the vocabulary: an image prompt's placeholders go
    # through embed_tokens before the image features replace them, so they must be inside it.
    v = tc["vocab_size"]
    cfg = AutoConfig.for_model(model_type, text_config=tc, vision_config=vision_config(a.arch),
                               image_token_id=v - 2, video_token_id=v - 1,
                               vision_start_token_id=v - 4, vision_end_token_id=v - 3,
                               tie_word_embeddings=tc["tie_word_embeddings"])
    model = AutoModelForImageTextToText.from_config(cfg, dtype=torch.bfloat16)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.add_(0.02 * torch.randn_like(p))
    model.save_pretrained(a.out)
    names = [n for n, _ in model.state_dict().items()]
    if a.manifest:
        import json
        from safetensors import safe_open
        import glob
        import os
        manifest = {}
        for f in sorted(glob.glob(os.path.join(a.out, "*.safetensors"))):
            with safe_open(f, "pt") as st:
                for k in st.keys():
                    t = st.get_slice(k)
                    manifest[k] = {"shape": list(t.get_shape()), "dtype": t.get_dtype()}
        with open(a.manifest, "w") as fh:
            json.dump(manifest, fh, indent=1, sort_keys=True)
    print(f"make_hf_image_text: {type(model).__name__} ({len(names)} tensors, "
          f"{sum(n.startswith('model.visual.') for n in names)} in the vision tower) -> {a.out}")


if __name__ == "__main__":
    main()
