#!/usr/bin/env bash
# Issue 51's load targets on the device: a Llama-3-8B-shaped checkpoint (make-fixture --shape,
# random bf16 weights) quantized by `quantize` to each scheme, then loaded by the engine and run
# for one short forward; per scheme the engine's own load line (time on the device, the host's
# share) and the process's peak host memory (tools/device/peak_rss.py: anonymous memory apart from
# the checkpoint's mapped pages). Targets: load <= 60 s, anonymous RSS <= 4 GB.
#   Q=path/to/qparity [LAYERS=N] bash tools/device/load_8b.sh [SCHEME...]
# LAYERS keeps the shape's widths with N decoder layers (make-fixture --layers): `quantize` of the
# 32 layers takes longer than one device call (issue 54), one layer about a minute.
# Schemes default to fp8-block ct-w4a16-g128 nvfp4 w8a8-static (msModelSlim W8A8). Each
# quantized copy is removed after its run (the device's disk holds the bf16 copy and one more).
set -u
: "${Q:?Q=qparity binary}"
here=$(cd "$(dirname "$0")" && pwd)
W=${W:-/tmp/load8b}
SHAPE=${SHAPE:-llama3-8b}
LAYERS=${LAYERS:-}
schemes=${*:-fp8-block ct-w4a16-g128 nvfp4 w8a8-static}
mkdir -p "$W"
if [ ! -f "$W/bf16/config.json" ]; then
  python3 "$here/peak_rss.py" "make-fixture $SHAPE" -- \
    "$Q" make-fixture --shape "$SHAPE" ${LAYERS:+--layers "$LAYERS"} --seed 1 --out "$W/bf16" 2>&1 |
    tail -2
fi
du -sh "$W/bf16"
for s in $schemes; do
  rm -rf "$W/q"
  python3 "$here/peak_rss.py" "quantize $s" -- \
    "$Q" quantize --in "$W/bf16" --scheme "$s" --calib-synthetic 16 --dialect vllm --out "$W/q" 2>&1 | tail -2
  [ -f "$W/q/config.json" ] || { echo "quantize $s failed"; continue; }
  echo "$s on disk: $(du -sh "$W/q" | cut -f1)"
  sync; echo 1 > /proc/sys/vm/drop_caches 2>/dev/null || true
  python3 "$here/peak_rss.py" "engine load+forward $s" -- \
    "$Q" engine run --model "$W/q" --synthetic 1 --seq-len 8 --dump "$W/$s.h5" --force 2>&1 |
    grep -E "on the device in|peak-rss|rror" | head -5
  rm -f "$W/$s.h5"
done
