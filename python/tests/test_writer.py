"""The writer against golden/SCHEMA.md, with numpy and h5py only."""
import os
import tempfile
import unittest

import h5py
import numpy as np

from qparity_dump import Candidate, CandidateError
from qparity_dump.writer import target_logprobs


def small_candidate(**kw):
    tokens = np.array([[1, 2, 3], [4, 5, 6]])
    c = Candidate(tokens, "test-engine", producer_version="9", model="m",
                  architecture="LlamaForCausalLM", device="NVIDIA H100 sm90", **kw)
    c.add_point("layers.0.residual", np.arange(6 * 4, dtype=np.float32).reshape(2, 3, 4))
    c.add_point("embed", np.ones((6, 4), dtype=np.float16))
    c.set_logits(np.linspace(-1, 1, 6 * 8).reshape(6, 8).astype(np.float16))
    return c


class WriterTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "cand.h5")

    def tearDown(self):
        self.dir.cleanup()

    def test_layout_attributes_and_scores(self):
        c = small_candidate(model_dtype="BF16")
        c.declare_absent("layers.*.attn.core", "fused attention kernel")
        c.write(self.path)
        with h5py.File(self.path, "r") as f:
            self.assertEqual(f.attrs["schema_version"], 1)
            self.assertEqual(f.attrs["schema_version"].dtype, np.int32)
            for key in ("producer", "producer_version", "model", "architecture",
                        "model_config_hash", "checkpoint_hash", "scheme", "dialect",
                        "precision_mode", "input_set", "device", "created", "point_dtype"):
                self.assertIn(key, f.attrs)
            self.assertEqual(f.attrs["seed"].dtype, np.uint64)
            self.assertEqual(f.attrs["model_dtype"], "BF16")
            self.assertEqual(list(f.attrs["absent_points"]),
                             ["layers.*.attn.core: fused attention kernel"])
            np.testing.assert_array_equal(f["inputs/targets"][()], [[2, 3, -1], [5, 6, -1]])
            order = sorted(f["points"], key=lambda n: f["points"][n].attrs["order"])
            self.assertEqual(order, ["embed", "layers.0.residual"])  # catalog order
            self.assertEqual(f["points/embed"].dtype, np.float32)
            self.assertEqual(f["points/layers.0.residual"].shape, (6, 4))
            self.assertEqual(f["outputs/logits"].dtype, np.float32)
            self.assertEqual(f["points/embed"].compression, "gzip")
            self.assertTrue(f["points/embed"].shuffle)
            logits = f["outputs/logits"][()].astype(np.float64)
            lp = f["outputs/target_logprobs"][()]
            want = logits[0] - np.log(np.exp(logits[0]).sum())
            self.assertAlmostEqual(lp[0], want[2], places=12)
            self.assertTrue(np.isnan(lp[2]) and np.isnan(lp[5]))
            nll = f["outputs/sequence_nll"][()]
            self.assertAlmostEqual(nll[1], -(lp[3] + lp[4]) / 2, places=12)
            np.testing.assert_allclose(f["outputs/sequence_ppl"][()], np.exp(nll))

    def test_never_overwrites_unless_asked(self):
        small_candidate().write(self.path)
        with self.assertRaisesRegex(CandidateError, "exists"):
            small_candidate().write(self.path)
        small_candidate(scheme="fp8-block").write(self.path, overwrite=True)
        with h5py.File(self.path, "r") as f:
            self.assertEqual(f.attrs["scheme"], "fp8-block")
        self.assertEqual(os.listdir(self.dir.name), ["cand.h5"])  # no temporary left

    def test_bad_input_is_named(self):
        c = small_candidate()
        with self.assertRaisesRegex(CandidateError, "layers.0.attn.qvk"):
            c.add_point("layers.0.attn.qvk", np.zeros((6, 2)))
        with self.assertRaisesRegex(CandidateError, r"points/layers.0.attn.out: shape \(5, 2\)"):
            c.add_point("layers.0.attn.out", np.zeros((5, 2)))
        with self.assertRaisesRegex(CandidateError, "given twice"):
            c.add_point("embed", np.zeros((6, 4)))
        with self.assertRaisesRegex(CandidateError, "names points/layers.0.residual"):
            c.declare_absent("layers.*.residual", "x")
        c.declare_absent("layers.*.attn.core")
        with self.assertRaisesRegex(CandidateError, "declared absent"):
            c.add_point("layers.1.attn.core", np.zeros((6, 2)))
        with self.assertRaisesRegex(CandidateError, "dialect"):
            Candidate([[1]], "e", dialect="tensorrt")
        with self.assertRaisesRegex(CandidateError, "inputs/tokens"):
            Candidate(np.zeros((0, 3), dtype=np.int64), "e")
        c = Candidate([[1, 9]], "e")
        c.add_point("embed", np.zeros((2, 1)))
        c.set_logits(np.zeros((2, 4)))
        with self.assertRaisesRegex(CandidateError, "vocabulary of 4"):
            c.write(self.path)
        self.assertFalse(os.path.exists(self.path))

    def test_target_logprobs_are_stable(self):
        lp = target_logprobs(np.array([[1000.0, 0.0], [0.0, 0.0]]), np.array([0, 1]))
        self.assertAlmostEqual(lp[0], 0.0)
        self.assertAlmostEqual(lp[1], np.log(0.5))


class CheckpointAndCliTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def test_index_entries_outside_the_directory_are_refused(self):
        # qparity refuses them; the hash must not read what they name (main read /etc/passwd).
        import json
        from qparity_dump import checkpoint_hash
        with open(os.path.join(self.dir.name, "model.safetensors.index.json"), "w") as f:
            json.dump({"weight_map": {"a.weight": "../../etc/passwd"}}, f)
        with self.assertRaisesRegex(ValueError, "not a file in the checkpoint directory"):
            checkpoint_hash(self.dir.name)

    def test_missing_output_directory_is_one_line_before_any_work(self):
        import contextlib
        import io
        from qparity_dump.__main__ import main
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = main(["hf", "--model", self.dir.name, "--tokens", "nope.txt", "--out",
                       os.path.join(self.dir.name, "missing", "c.h5")])
        self.assertEqual(rc, 1)
        self.assertIn("does not exist", err.getvalue())
        self.assertNotIn("Traceback", err.getvalue())


if __name__ == "__main__":
    unittest.main()
