#!/usr/bin/env python3
"""Per-kernel time of one decode step, from Nsight Compute (ncu), against the step's wall time.

Usage (on the device, after a build): python3 tools/device/profile_decode.py [BENCH] [MODEL] [BATCH]
(BENCH may instead be a saved `ncu --csv --page raw` output of the same bench command.)
Runs bench_engine under ncu for one model and batch size with one timed decode step, then sums
gpu__time_duration per kernel family over that step (the 4th forward: prefill, captured step,
prefill again, timed step), clocks and caches left as they are. ncu serializes and instruments
every kernel, so the sum runs above the step's time in a CUDA graph (no overlap from programmatic
dependent launch, per-kernel profiling overhead): read the shares, not the sum.
"""
import collections
import csv
import io
import subprocess
import sys

bench = sys.argv[1] if len(sys.argv) > 1 else "build-device/bench/bench_engine"
model = sys.argv[2] if len(sys.argv) > 2 else "qwen3-0.6b"
batch = sys.argv[3] if len(sys.argv) > 3 else "1"
# PROFILE_ARGS: bench_engine arguments instead of "--context 512 --prefill 512" (e.g. "--experts
# w4a16-g32 --context 16 --prefill 16" for the MoE shape, whose prefill of quantized experts is
# thousands of launches); STEP_FORWARD: which forward is the timed step (3; 4 for a MoE model,
# whose bench traces one more forward).
import os
extra = os.environ.get("PROFILE_ARGS", "--context 512 --prefill 512").split()
step_forward = int(os.environ.get("STEP_FORWARD", "3"))
args = [bench, "--models", model, "--batches", batch, "--steps", "1", "--no-linears"] + extra
if bench.endswith(".csv"):  # a saved ncu --csv --page raw output
    out = subprocess.CompletedProcess([], 0, open(bench).read(), "")
else:
    # Clocks and caches as the bench runs them (ncu's defaults lock base clocks and flush caches).
    out = subprocess.run(["ncu", "--metrics", "gpu__time_duration.sum", "--csv", "--page", "raw",
                          "--print-units", "base", "--clock-control", "none", "--cache-control",
                          "none"] + args, capture_output=True, text=True)
if out.returncode != 0:
    sys.exit("ncu failed:\n" + out.stderr[-3000:])
text = out.stdout[out.stdout.find('"ID"'):]
rows = [r for r in csv.DictReader(io.StringIO(text)) if r.get("ID", "").isdigit()]
forwards, cur = [], None
for r in rows:
    name = r["Kernel Name"].replace("(anonymous namespace)", "").replace("<unnamed>", "")
    name = name.replace("void ", "")
    name = name.split("(")[0].split("<")[0].split("::")[-1]
    if "embedding" in name:
        cur = []
        forwards.append(cur)
    if cur is not None:
        cur.append((name, float(r["gpu__time_duration.sum"].replace(",", ""))))
if len(forwards) < step_forward + 1:
    sys.exit(f"expected at least {step_forward + 1} forwards, found {len(forwards)} in {len(rows)} profiled "
             f"kernels; ncu said:\n{out.stdout[:3000]}\n{out.stderr[-2000:]}")
step = forwards[step_forward]
by = collections.defaultdict(lambda: [0, 0.0])
for name, ns in step:
    by[name][0] += 1
    by[name][1] += ns
total = sum(v[1] for v in by.values())
print(f"{model} batch {batch}: one decode step, {len(step)} kernels, {total / 1e3:.1f} us under "
      "ncu (serialized, instrumented)")
for name, (n, ns) in sorted(by.items(), key=lambda kv: -kv[1][1]):
    print(f"  {name[:60]:60s} x{n:4d} {ns / 1e3:9.1f} us  {100 * ns / total:5.1f} %")
