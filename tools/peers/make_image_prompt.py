#!/usr/bin/env python3
"""An image prompt for an image-text checkpoint (Qwen3-VL, Qwen3.5), as the processor lays it out,
for `qparity trace --pixels` and `hf_reference.py --pixels` to run alike (GPU image; never in CI).

Writes --pixels (safetensors: seeded normal `pixel_values` [N, C*T*P*P] F64 and `image_grid_thw`
I64 [n, 3] from --grids, images only: t = 1) and --tokens (comma-separated ids): for each image
some text, vision_start, t*h*w / merge^2 image placeholders, vision_end; then trailing text. Text
ids are drawn below the smallest special id, so no text token is a placeholder.

Usage: make_image_prompt.py --model DIR --pixels F --tokens F [--grids 1,4,4;1,6,8] [--seed N]
"""
import argparse
import json
import os

import torch
from safetensors.torch import save_file


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--pixels", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--grids", default="1,4,4;1,6,8")
    ap.add_argument("--seed", type=int, default=5)
    a = ap.parse_args()
    with open(os.path.join(a.model, "config.json")) as f:
        config = json.load(f)
    vc = config["vision_config"]
    merge = vc["spatial_merge_size"]
    grids = torch.tensor([[int(x) for x in g.split(",")] for g in a.grids.split(";")],
                         dtype=torch.int64)
    if (grids[:, 0] != 1).any():
        raise SystemExit("make_image_prompt: images only (t = 1)")
    gen = torch.Generator().manual_seed(a.seed)
    n = int(grids.prod(dim=1).sum())
    width = vc.get("in_channels", 3) * vc["temporal_patch_size"] * vc["patch_size"] ** 2
    save_file({"pixel_values": torch.randn(n, width, generator=gen, dtype=torch.float64),
               "image_grid_thw": grids}, a.pixels)
    special = min(config[k] for k in ("image_token_id", "video_token_id",
                                      "vision_start_token_id", "vision_end_token_id"))

    def text(count):
        return torch.randint(0, special, (count,), generator=gen).tolist()

    ids = []
    for i, (t, h, w) in enumerate(grids.tolist()):
        ids += text(3 + 2 * i) + [config["vision_start_token_id"]]
        ids += [config["image_token_id"]] * (t * h * w // merge ** 2)
        ids += [config["vision_end_token_id"]]
    ids += text(5)
    with open(a.tokens, "w") as f:
        f.write(",".join(str(i) for i in ids))
    print(f"make_image_prompt: {len(grids)} images, {n} patches, {len(ids)} tokens")


if __name__ == "__main__":
    main()
