#!/usr/bin/env bash
# The judge's confusion matrix over the trained fixtures in several schemes (docs/JUDGE.md, "The
# judge, measured"): each fixture quantized by `qparity quantize` (dialect vllm; modules a
# scheme's kernels cannot take stay unquantized, --ignore-unsupported, as vLLM's checks would
# refuse them), then one `qparity judge-matrix` over all of them. Prints the Markdown table; writes
# OUT/judge-matrix.{json,md,html} and keeps the checkpoints under OUT/checkpoints.
#   tools/judge/judge_matrix.sh QPARITY OUT [SCHEME...]
# Default schemes: bf16 w8a16-ch ct-w4a16-g128 fp8-block w8a8-int8-dyn nvfp4a16.
# Exit status: judge-matrix's (3 when a cell is not as expected).
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 QPARITY OUT [SCHEME...]" >&2; exit 2; }
qparity=$1 out=$2
shift 2
schemes=("$@")
[ ${#schemes[@]} -gt 0 ] || schemes=(bf16 w8a16-ch ct-w4a16-g128 fp8-block w8a8-int8-dyn nvfp4a16)
src=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out/checkpoints"
args=()
for model in llama qwen3 qwen3-moe; do
  for scheme in "${schemes[@]}"; do
    if [ "$scheme" = bf16 ]; then
      args+=(--model "$src/fixtures/trained/$model")
      continue
    fi
    dir=$out/checkpoints/$model.$scheme
    [ -d "$dir" ] || "$qparity" quantize --in "$src/fixtures/trained/$model" --scheme "$scheme" \
      --dialect vllm --ignore-unsupported --out "$dir" >&2
    args+=(--model "$dir")
  done
done
status=0
"$qparity" judge-matrix "${args[@]}" --out "$out" || status=$?
exit "$status"
