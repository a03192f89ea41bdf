#!/usr/bin/env bash
# qparity's fp64 reference on ChatGLM2 fixtures (tiny and small: MQA with 2 and 4 KV groups,
# rotary on half of each head) against the independent numpy forward; exit status of the peer.
set -euo pipefail
qparity=$1 python=$2 peer=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for size in tiny small; do
  "$qparity" make-fixture --arch chatglm2 --size "$size" --seed 7 --out "$work/$size" >/dev/null
  "$qparity" trace --model "$work/$size" --synthetic 40 --seed 11 --out "$work/$size.trace" \
    >/dev/null
  echo "== ChatGLM2 $size"
  "$python" "$peer" --model "$work/$size" --trace "$work/$size.trace" --bound 1e-12
done
