"""The name maps against the capture-point catalog, and the recorder (numpy, no torch)."""
import unittest

import numpy as np

from qparity_dump import ModelShape, Recorder, CandidateError, order_of
from qparity_dump.maps import MAPS
from qparity_dump.maps.base import heads_first_to_tokens
from qparity_dump.maps.hf import hf_map

LLAMA = dict(architectures=["LlamaForCausalLM"], hidden_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
             intermediate_size=96)
QWEN3 = dict(LLAMA, architectures=["Qwen3ForCausalLM"], head_dim=32)
MOE = dict(QWEN3, architectures=["Qwen3MoeForCausalLM"], num_experts=8, num_experts_per_tok=2,
           moe_intermediate_size=32, mlp_only_layers=[0], norm_topk_prob=True)
# Qwen3.5 as its image-text class nests it: Gated DeltaNet layers beside gated full attention.
QWEN35 = dict(architectures=["Qwen3_5ForConditionalGeneration"],
              text_config=dict(QWEN3, num_hidden_layers=4, full_attention_interval=4,
                               linear_num_key_heads=2, linear_num_value_heads=4,
                               linear_key_head_dim=16, linear_value_head_dim=8))


class CatalogTest(unittest.TestCase):
    def test_points_and_widths(self):
        s = ModelShape(MOE)
        p = s.points()
        self.assertEqual(p[0], "embed")
        self.assertEqual(p[-2:], ["final_norm", "logits"])
        self.assertIn("layers.0.mlp.gate_up", p)          # mlp_only layer: dense
        self.assertIn("layers.1.moe.topk_ids", p)
        self.assertNotIn("layers.1.mlp.act", p)
        self.assertEqual(s.width("layers.0.attn.qkv"), 4 * 32 + 2 * 2 * 32)
        self.assertEqual(s.width("layers.1.moe.expert_out"), 2 * 64)
        self.assertEqual(s.width("layers.0.mlp.gate_up"), 2 * 96)
        self.assertEqual(ModelShape(LLAMA).width("layers.1.attn.rope_q"), 64)
        self.assertFalse(ModelShape(LLAMA).qk_norm)

    def test_qwen35_points_come_from_the_generated_catalog(self):
        s = ModelShape(QWEN35)
        p = s.points()
        # Layers 0-2 Gated DeltaNet, layer 3 gated full attention (full_attention_interval 4).
        layer0 = [x for x in p if x.startswith("layers.0.")]
        self.assertEqual(layer0[:3], ["layers.0.input_norm", "layers.0.linear_attn.qkvz",
                                      "layers.0.linear_attn.ba"])
        self.assertNotIn("layers.0.attn.qkv", p)
        self.assertNotIn("layers.0.attn.q_norm", p)
        self.assertIn("layers.3.attn.q_norm", p)
        self.assertLess(p.index("layers.3.attn.core"), p.index("layers.3.attn.gated"))
        self.assertLess(p.index("layers.3.attn.gated"), p.index("layers.3.attn.out"))
        # Widths from the text config: conv_dim = 2 * 2*16 + 4*8 = 96, value_dim 32.
        self.assertEqual(s.width("layers.0.linear_attn.qkvz"), 96 + 32)
        self.assertEqual(s.width("layers.0.linear_attn.conv"), 96)
        self.assertEqual(s.width("layers.0.linear_attn.state"), 4 * 16 * 8)
        self.assertEqual(s.width("layers.3.attn.qkv"), 2 * 4 * 32 + 2 * 2 * 32)  # q and gate
        self.assertEqual(s.width("layers.3.attn.gated"), 4 * 32)
        # The order helper knows them too (they used to sort last, as unknown names).
        self.assertEqual(order_of(list(reversed(p))), p)


class MapsTest(unittest.TestCase):
    def test_every_map_accounts_for_every_point(self):
        for name, m in list(MAPS.items()) + [("hf-4.x", hf_map(False))]:
            for cfg in (LLAMA, QWEN3, MOE):
                shape = ModelShape(cfg)
                taps, expected, absent = m.plan(shape)
                points = set(shape.points(kv_cache=True))
                self.assertTrue(set(expected) <= points, name)
                import fnmatch
                covered = {p for p in points for g, _ in absent if fnmatch.fnmatchcase(p, g)}
                self.assertEqual(covered | set(expected), points, f"{name} {cfg['architectures']}")
                self.assertFalse(covered & set(expected), name)
                for _, reason in absent:
                    self.assertTrue(reason, f"{name}: an absent point without its reason")

    def test_hf_router_variants(self):
        shape = ModelShape(MOE)
        _, exp5, abs5 = hf_map(True).plan(shape)
        _, exp4, abs4 = hf_map(False).plan(shape)
        self.assertIn("layers.1.moe.topk_ids", exp5)
        self.assertIn("layers.*.moe.router_logits", dict(abs5))
        self.assertIn("layers.1.moe.router_logits", exp4)
        self.assertIn("layers.*.moe.topk_ids", dict(abs4))

    def test_incomplete_map_is_refused(self):
        m = hf_map(True)
        del m.absent["moe.expert_out"]
        with self.assertRaisesRegex(ValueError, "moe.expert_out"):
            m.plan(ModelShape(MOE))


class FakeTorch:  # numpy stand-in with the one torch method heads_first uses
    def __init__(self, a):
        self.a, self.shape = a, a.shape

    def transpose(self, i, j):
        return FakeTorch(np.swapaxes(self.a, i, j))

    def reshape(self, *s):
        return self.a.reshape(*s)


class RecorderTest(unittest.TestCase):
    def test_parts_chunks_and_layouts(self):
        r = Recorder(points_expected=["layers.0.attn.qkv", "layers.0.attn.rope_q"])
        for call in range(2):  # two forward calls of 2 sequences x 3 tokens
            r.begin(2, 3)
            base = call * 100
            r.put("layers.0.attn.qkv", np.full((2, 3, 4), base + 1.0), part=(0, 3))
            r.put("layers.0.attn.qkv", np.full((6, 2), base + 2.0), part=(2, 3))
            r.put("layers.0.attn.qkv", np.full((2, 3, 2), base + 3.0), part=(1, 3))
            heads_first = np.arange(2 * 2 * 3 * 5).reshape(2, 2, 3, 5) + base  # [B, H, T, D]
            r.put("layers.0.attn.rope_q", heads_first_to_tokens(FakeTorch(heads_first)))
            r.end()
        a = r.arrays()
        self.assertEqual(a["layers.0.attn.qkv"].shape, (12, 8))
        np.testing.assert_array_equal(a["layers.0.attn.qkv"][0], [1] * 4 + [3] * 2 + [2] * 2)
        self.assertEqual(a["layers.0.attn.qkv"][6, 0], 101)
        rope = a["layers.0.attn.rope_q"]
        # row = sequence 1, token 2: heads 0 and 1 side by side
        np.testing.assert_array_equal(rope[5], np.concatenate(
            [np.arange(5) + (1 * 30 + 0 * 15 + 2 * 5), np.arange(5) + (1 * 30 + 15 + 2 * 5)]))

    def test_errors_name_the_point(self):
        r = Recorder(points_expected=["embed", "final_norm"])
        r.begin(1, 4)
        with self.assertRaisesRegex(CandidateError, r"points/embed: a hook saw shape \(3, 2\)"):
            r.put("embed", np.zeros((3, 2)))
        r.put("embed", np.zeros((4, 2)))
        with self.assertRaisesRegex(CandidateError, "twice in one forward call"):
            r.put("embed", np.zeros((4, 2)))
        r.put("layers.0.attn.qkv", np.zeros((4, 2)), part=(0, 2))
        with self.assertRaisesRegex(CandidateError, "only parts"):
            r.end()
        r = Recorder(points_expected=["embed", "final_norm"])
        r.begin(1, 4)
        r.put("embed", np.zeros((4, 2)))
        r.end()
        with self.assertRaisesRegex(CandidateError, "points/final_norm: the map promised it"):
            r.arrays()


if __name__ == "__main__":
    unittest.main()
