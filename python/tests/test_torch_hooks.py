"""The hooks on real transformers modules (random tiny models on the CPU). Needs torch and
transformers: skipped, saying so, where they are not installed (CI); run on the GPU image."""
import json
import os
import tempfile
import unittest

import h5py
import numpy as np

try:
    import torch
    import transformers
    HAVE = True
    WHY = ""
except ImportError as e:  # CI has numpy and h5py only
    HAVE = False
    WHY = f"torch/transformers not installed ({e}); the hooks run on the GPU image"

from test_maps import LLAMA, MOE, QWEN3


@unittest.skipUnless(HAVE, WHY)
class TorchHooksTest(unittest.TestCase):
    def dump(self, cfg):
        from qparity_dump.capture import dump
        from qparity_dump.hf import map_for
        d = tempfile.mkdtemp()
        cfg = dict(cfg, rms_norm_eps=1e-6, max_position_embeddings=64, tie_word_embeddings=False,
                   torch_dtype="float32")
        config = transformers.AutoConfig.for_model(
            {"LlamaForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3",
             "Qwen3MoeForCausalLM": "qwen3_moe"}[cfg["architectures"][0]], **cfg)
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
        model.save_pretrained(d)
        model = transformers.AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager")
        model.eval()
        tokens = np.array([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])
        out = os.path.join(d, "cand.h5")
        dump(model, map_for(model), d, tokens, out, "hf-transformers", batch=1)
        return model, tokens, h5py.File(out, "r")

    def check(self, cfg):
        model, tokens, f = self.dump(cfg)
        p = f["points"]
        with open(os.path.join(f.filename.rsplit("/", 1)[0], "config.json")) as c:
            self.assertEqual(json.load(c)["architectures"], cfg["architectures"])
        # attn.out is o_proj(attn.core); the final norm of the last residual is final_norm
        layer = model.model.layers[1]
        with torch.no_grad():
            out = layer.self_attn.o_proj(torch.tensor(p["layers.1.attn.core"][()]))
            np.testing.assert_allclose(out.numpy(), p["layers.1.attn.out"][()], rtol=1e-5,
                                       atol=1e-6)
            fn = model.model.norm(torch.tensor(p["layers.1.residual"][()]))
            np.testing.assert_allclose(fn.numpy(), p["final_norm"][()], rtol=1e-5, atol=1e-6)
            qkv = torch.cat([layer.self_attn.q_proj(torch.tensor(p["layers.1.input_norm"][()])),
                             layer.self_attn.k_proj(torch.tensor(p["layers.1.input_norm"][()])),
                             layer.self_attn.v_proj(torch.tensor(p["layers.1.input_norm"][()]))],
                            -1)
            np.testing.assert_allclose(qkv.numpy(), p["layers.1.attn.qkv"][()], rtol=1e-5,
                                       atol=1e-6)
        # rope at position 0 is the identity
        src = "layers.0.attn.q_norm" if "layers.0.attn.q_norm" in p else None
        if src is None:
            q = p["layers.0.attn.qkv"][()][:, :p["layers.0.attn.rope_q"].shape[1]]
        else:
            q = p[src][()]
        np.testing.assert_allclose(p["layers.0.attn.rope_q"][0], q[0], rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(p["logits"][()], f["outputs/logits"][()])
        self.assertEqual(f["points/embed"].shape[0], tokens.size)
        return f

    def test_llama(self):
        self.check(LLAMA)

    def test_qwen3(self):
        self.check(QWEN3)

    def test_qwen3_moe(self):
        f = self.check(MOE)
        ids = f["points/layers.1.moe.topk_ids"][()]
        self.assertEqual(ids.shape, (10, 2))
        self.assertTrue(((ids >= 0) & (ids < 8)).all() and (ids == np.round(ids)).all())
        w = f["points/layers.1.moe.topk_weights"][()]
        np.testing.assert_allclose(w.sum(1), 1.0, rtol=1e-5)  # norm_topk_prob
        absent = " ".join(f.attrs["absent_points"])
        self.assertIn("moe.expert_out", absent)


if __name__ == "__main__":
    unittest.main()
