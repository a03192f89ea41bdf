"""Fused projections split and regathered into the catalog's points (numpy)."""
import unittest

import numpy as np

from qparity_dump import (gather_gate_up_shards, gather_qkv_shards, join_qkv, split_gate_up,
                          split_qkv)


class FusedTest(unittest.TestCase):
    def test_split_and_join_round_trip(self):
        x = np.arange(3 * 14).reshape(3, 14)
        q, k, v = split_qkv(x, 8, 3)
        np.testing.assert_array_equal(q, x[:, :8])
        np.testing.assert_array_equal(v, x[:, 11:])
        np.testing.assert_array_equal(join_qkv(q, k, v), x)
        g, u = split_gate_up(x, 7)
        np.testing.assert_array_equal(np.concatenate([g, u], 1), x)
        with self.assertRaisesRegex(ValueError, "qkv width 14"):
            split_qkv(x, 8, 4)
        with self.assertRaisesRegex(ValueError, "gate_up width"):
            split_gate_up(x, 6)

    def qkv_heads(self, heads, kv_heads, d, tokens=2):
        q = np.random.default_rng(1).normal(size=(tokens, heads * d))
        k = np.random.default_rng(2).normal(size=(tokens, kv_heads * d))
        v = np.random.default_rng(3).normal(size=(tokens, kv_heads * d))
        return q, k, v

    def shard(self, q, k, v, tp, kv_heads, d):
        per_q = q.shape[1] // tp
        shards = []
        for r in range(tp):
            if tp <= kv_heads:
                per_kv = k.shape[1] // tp
                ks, vs = k[:, r * per_kv:(r + 1) * per_kv], v[:, r * per_kv:(r + 1) * per_kv]
            else:  # replicated: rank r holds KV head r // (tp / kv_heads)
                h = r // (tp // kv_heads)
                ks, vs = k[:, h * d:(h + 1) * d], v[:, h * d:(h + 1) * d]
            shards.append(np.concatenate([q[:, r * per_q:(r + 1) * per_q], ks, vs], 1))
        return shards

    def test_tensor_parallel_shards_regather(self):
        for heads, kv_heads, tp in ((8, 4, 2), (8, 2, 4), (8, 2, 8), (4, 4, 1)):
            q, k, v = self.qkv_heads(heads, kv_heads, 4)
            got = gather_qkv_shards(self.shard(q, k, v, tp, kv_heads, 4), heads, kv_heads, 4)
            np.testing.assert_array_equal(got, np.concatenate([q, k, v], 1),
                                          err_msg=f"{heads}/{kv_heads} heads over {tp}")
        g = np.arange(12).reshape(1, 12)
        u = -np.arange(12).reshape(1, 12)
        shards = [np.concatenate([g[:, r * 4:(r + 1) * 4], u[:, r * 4:(r + 1) * 4]], 1)
                  for r in range(3)]
        np.testing.assert_array_equal(gather_gate_up_shards(shards, 12),
                                      np.concatenate([g, u], 1))
        with self.assertRaisesRegex(ValueError, "do not split"):
            gather_qkv_shards([np.zeros((1, 8))] * 3, 8, 2, 1)


if __name__ == "__main__":
    unittest.main()
