"""pytest plugin: accuracy checks of an engine against qparity's reference, as pytest asserts.

    pytest -p qparity_dump.pytest_plugin [--qparity PATH] [--qparity-reports DIR]

gives tests the fixture ``qparity_check``:

    def test_my_engine_w8a16(qparity_check):
        verdict = qparity_check("ckpt/", tokens=ids,             # [S, T] array, a token file
                                candidate=run_my_engine,         # or a candidate .h5 already made
                                scheme="W8A16")                  # quantize ckpt/ first (optional)
        # passes, or fails the test with the verdict, the policy's reasons, the report's path and
        # bisect's table in the message

A callable candidate is called as ``run_my_engine(model_dir, tokens, out_path)``: it runs the
checkpoint ``model_dir`` on ``tokens`` ([S, T] int64, each sequence from an empty cache) and
writes its dump to ``out_path`` (``qparity_dump.Candidate`` or the hooks). The check runs
``qparity validate --model <checkpoint> --candidate <dump>`` (the reference golden of the same
checkpoint, the engine policy of its scheme for the candidate's device; ``policy=`` a policy
directory, or one policy file, which then judges the dump through ``qparity report``), then on
FAIL ``qparity bisect --model``. NOT JUDGED fails too: a pass has to be earned. The verdict,
report path and bisect output are attached to the test as JUnit properties (record_property).
``golden=`` takes the tokens of an existing golden instead of ``tokens=``.
"""
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from .tokens import read_tokens


def pytest_addoption(parser):
    group = parser.getgroup("qparity")
    group.addoption("--qparity", default=os.environ.get("QPARITY"),
                    help="the qparity executable (default: $QPARITY, else qparity on PATH)")
    group.addoption("--qparity-reports", default=None,
                    help="keep each check's reports under this directory (default: the test's "
                         "tmp_path)")


class QparityVerdict:
    """What a check found: verdict (PASS / FAIL / NOT JUDGED), the report's summary and paths."""

    def __init__(self, verdict, summary, report, reports_dir, bisect=""):
        self.verdict = verdict
        self.summary = summary
        self.report = report
        self.reports_dir = reports_dir
        self.bisect = bisect

    def __repr__(self):
        return f"QparityVerdict({self.verdict}, report={self.report})"


def _executable(config):
    exe = config.getoption("--qparity") or shutil.which("qparity")
    if not exe:
        raise pytest.UsageError("qparity_check: no qparity executable (--qparity PATH, $QPARITY "
                                "or qparity on PATH)")
    return exe


def _run(cmd):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def _rows(out):
    """The report summaries an index lists, in the order written."""
    with open(os.path.join(out, "index.json")) as f:
        index = json.load(f)
    rows = []
    for rel in index.get("reports", []):
        with open(os.path.join(out, rel + ".json")) as f:
            rows.append((os.path.join(out, rel + ".md"), json.load(f)["summary"]))
    return rows


@pytest.fixture
def qparity_exe(request):
    """The qparity executable the checks run."""
    return _executable(request.config)


@pytest.fixture
def qparity_check(request, tmp_path, record_property):
    exe = _executable(request.config)
    keep = request.config.getoption("--qparity-reports")
    counter = [0]

    def check(model_dir, tokens=None, candidate=None, *, golden=None, scheme=None, policy=None,
              dialect="vllm", bisect=True):
        if candidate is None:
            raise ValueError("qparity_check: candidate= (a dump's path, or a callable that "
                             "writes one) is required")
        if (tokens is None) == (golden is None):
            raise ValueError("qparity_check: give tokens= or golden=, one of them")
        counter[0] += 1
        name = f"{request.node.name}-{counter[0]}".replace("/", "_").replace("[", "_").rstrip("]")
        work = tmp_path / f"qparity-{counter[0]}"
        work.mkdir()
        out = os.path.join(keep, name) if keep else str(work / "reports")
        if os.path.exists(out):
            shutil.rmtree(out)
        os.makedirs(out)
        # The checkpoint the candidate runs: model_dir, or its quantization into `scheme`.
        checkpoint = str(model_dir)
        if scheme is not None and scheme != "bf16":
            checkpoint = str(work / (os.path.basename(os.path.normpath(model_dir)) + "-" + scheme))
            rc, log = _run([exe, "quantize", "--in", model_dir, "--scheme", scheme, "--dialect",
                            dialect, "--out", checkpoint])
            if rc != 0:
                pytest.fail(f"qparity quantize --scheme {scheme} exited {rc}:\n{log}")
        if golden is not None:
            tokens = read_tokens(golden)
        elif isinstance(tokens, (str, os.PathLike)):
            tokens = read_tokens(tokens)
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.ndim == 1:
            tokens = tokens.reshape(1, -1)
        if callable(candidate):
            path = str(work / "candidate.h5")
            candidate(checkpoint, tokens, path)
            if not os.path.isfile(path):
                pytest.fail(f"the engine callable wrote no candidate at {path}")
            candidate = path
        policy_args = ["--policies", policy] if policy and os.path.isdir(policy) else []
        rc, log = _run([exe, "validate", "--model", checkpoint, "--candidate", candidate,
                        "--out", out, "--keep-work", "--junit", os.path.join(out, "junit.xml")]
                       + policy_args)
        if rc not in (0, 3):
            pytest.fail(f"qparity validate exited {rc} (an error, not a verdict):\n{log}")
        goldens = [os.path.join(out, ".work", f) for f in os.listdir(os.path.join(out, ".work"))
                   if f.endswith(".candidate-golden.h5")]
        if policy and not os.path.isdir(policy):
            # One policy file: it judges the dump against the golden validate made.
            out = os.path.join(out, "policy")
            rc, log = _run([exe, "report", goldens[0], candidate, "--policy", policy, "--role",
                            "engine", "--out", out, "--junit", os.path.join(out + ".junit.xml")],
                           "report")
            if rc not in (0, 3):
                pytest.fail(f"qparity report exited {rc} (an error, not a verdict):\n{log}")
        report, summary = _rows(out)[-1]
        verdict = summary.get("verdict", "PASS" if summary.get("pass") else "FAIL")
        record_property("qparity_verdict", verdict)
        record_property("qparity_report", report)
        text = ""
        if verdict == "FAIL" and bisect:
            cmd = [exe, "bisect", goldens[0], candidate, "--model", checkpoint]
            if policy and not os.path.isdir(policy):
                cmd += ["--policy", policy]
            _, text = _run(cmd)
            with open(os.path.join(out, "bisect.txt"), "w") as f:
                f.write(text)
            record_property("qparity_bisect", text)
        result = QparityVerdict(verdict, summary, report, out, text)
        if verdict != "PASS":
            reasons = "\n  ".join(summary.get("failures") or [summary.get("judged_by", "")])
            pytest.fail(f"qparity: {summary.get('model')} {summary.get('scheme')} "
                        f"({summary.get('engine')} on {summary.get('device_name')}): {verdict}\n"
                        f"  {reasons}\nreport: {report}" + (f"\nbisect:\n{text}" if text else ""))
        return result

    return check
