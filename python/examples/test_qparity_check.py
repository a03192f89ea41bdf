"""Example tests of the pytest plugin (qparity's CI runs them):

    pytest -p qparity_dump.pytest_plugin python/examples --qparity build/tools/qparity/qparity

The "engine" is a stand-in, as in examples/downstream: qparity's own fp64 reference in emulate
mode (`qparity trace --mode emulate`, the arithmetic a correct bf16 / W8A16 engine has), its
numbers written through qparity_dump.Candidate. A second engine runs a copy of the checkpoint with
one bf16 weight doubled while its dump names the original checkpoint: an engine that loads one
scale wrong, which the check must fail and bisect must place in layer 1.
"""
import json
import os
import shutil
import struct
import subprocess

import numpy as np
import pytest

import qparity_dump as qd


def _trained_fixture(exe, name):
    """A trained fixture installed with qparity (share/qparity) or beside it in a build tree."""
    here = os.path.dirname(os.path.realpath(exe))
    for d in (os.path.join(here, "..", "share", "qparity", "fixtures", "trained", name),
              os.path.join(here, "fixtures", "trained", name)):
        if os.path.isdir(d):
            return os.path.normpath(d)
    pytest.skip(f"no trained fixture {name} beside {exe}")


def _read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        dtype = {"F64": np.float64, "I64": np.int64}[t["dtype"]]
        out[name] = np.frombuffer(data[b:e], dtype=dtype).reshape(t["shape"])
    return out


def _doubled_copy(model_dir, tensor, dst):
    """model_dir with one BF16 tensor doubled (+1 on each normal value's exponent)."""
    shutil.copytree(model_dir, dst)
    path = os.path.join(dst, "model.safetensors")
    with open(path, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        t = json.loads(f.read(n))[tensor]
        assert t["dtype"] == "BF16"
        b, e = t["data_offsets"]
        f.seek(8 + n + b)
        v = np.frombuffer(f.read(e - b), dtype=np.uint16).copy()
        exponent = (v >> 7) & 0xFF
        normal = (exponent >= 1) & (exponent <= 253)
        v[normal] += np.uint16(1 << 7)
        f.seek(8 + n + b)
        f.write(v.tobytes())
    return dst


def reference_engine(exe, plant_fault=None):
    def run(model_dir, tokens, out):
        work = out + ".work"
        os.makedirs(work)
        runs = _doubled_copy(model_dir, plant_fault, os.path.join(work, "model")) \
            if plant_fault else model_dir
        points, logits = {}, []
        for s, seq in enumerate(tokens):
            trace = os.path.join(work, f"sequence-{s}.safetensors")
            subprocess.run([exe, "trace", "--model", runs, "--token-ids",
                            ",".join(str(int(i)) for i in seq), "--mode", "emulate",
                            "--dialect", "vllm", "--out", trace], check=True,
                           capture_output=True)
            for name, values in _read_safetensors(trace).items():
                if name == "logits":
                    logits.append(values)  # the outputs, and the capture point of that name
                if name != "tokens":
                    points.setdefault(name, []).append(values)
        cand = qd.Candidate.for_checkpoint(model_dir, tokens, producer="reference-as-engine",
                                           scheme=qd_scheme(exe, model_dir), dialect="vllm",
                                           device="cpu")
        for name in qd.order_of(points):
            cand.add_point(name, np.concatenate(points[name]))
        cand.set_logits(np.concatenate(logits))
        cand.write(out)
    return run


def qd_scheme(exe, model_dir):
    """The scheme of a checkpoint by its own quantization config (qparity inspect --json)."""
    p = subprocess.run([exe, "inspect", model_dir, "--json"], check=True, capture_output=True,
                       text=True)
    modules = json.loads(p.stdout)["quant_plan"]["modules"]
    schemes = sorted({m["scheme"] for m in modules if m["quantized"] and m["scheme"]})
    return "+".join(schemes) or "bf16"


def _tokens(exe, model):
    text = os.path.join(os.path.dirname(model), "eval.txt")
    p = subprocess.run([exe, "tokenize", "--model", model, "--text", text], check=True,
                       capture_output=True, text=True)
    return np.asarray([int(i) for i in p.stdout.split()[:64]], dtype=np.int64).reshape(2, 32)


def test_a_correct_engine_passes(qparity_check, qparity_exe):
    model = _trained_fixture(qparity_exe, "llama")
    verdict = qparity_check(model, tokens=_tokens(qparity_exe, model),
                            candidate=reference_engine(qparity_exe))
    assert verdict.verdict == "PASS"


def test_a_correct_w8a16_engine_passes(qparity_check, qparity_exe):
    model = _trained_fixture(qparity_exe, "llama")
    verdict = qparity_check(model, tokens=_tokens(qparity_exe, model), scheme="w8a16-ch",
                            candidate=reference_engine(qparity_exe))
    assert verdict.summary["scheme"] == "w8a16-ch"


def test_a_planted_fault_fails_with_bisect_in_the_message(qparity_check, qparity_exe):
    model = _trained_fixture(qparity_exe, "llama")
    engine = reference_engine(qparity_exe, plant_fault="model.layers.1.mlp.down_proj.weight")
    with pytest.raises(pytest.fail.Exception) as failed:
        qparity_check(model, tokens=_tokens(qparity_exe, model), candidate=engine)
    message = str(failed.value)
    assert ": FAIL" in message and "report: " in message
    assert "bisect:" in message and "layers.1." in message
