#!/usr/bin/env bash
# A CPU runner's job (docs/CI-RECIPES.md): what each scheme does to a model, as format rows of
# the fp64 reference (no GPU, no engine), with the reports and a JUnit file as the job's
# artifacts. Exit status: validate's (0 every row within its budget, 3 a row outside, 1 / 2 an
# error). qparity's own CI runs it on a trained fixture (tests/CMakeLists.txt).
#
#   cpu-format-rows.sh MODEL_DIR SCHEMES OUT [TEXT]
#     QPARITY      the qparity executable (default: qparity on PATH)
#     SEQUENCES    evaluation sequences (default 4); SEQ_LEN tokens each (default 64)
#     BUDGET       kld=X,top1=Y,dln_ppl=Z (default: each scheme's policy)
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 MODEL_DIR SCHEMES OUT [TEXT]" >&2
  exit 2
fi
model=$1 schemes=$2 out=$3 text=${4:-}
qparity=${QPARITY:-qparity}
args=(validate --model "$model" --schemes "$schemes" --no-engine --out "$out"
      --sequences "${SEQUENCES:-4}" --seq-len "${SEQ_LEN:-64}" --junit "$out/junit.xml")
[ -n "$text" ] && args+=(--text "$text")
[ -n "${BUDGET:-}" ] && args+=(--budget "$BUDGET")
mkdir -p "$out"
set +e
"$qparity" "${args[@]}"
rc=$?
set -e
echo "cpu-format-rows: exit $rc; reports in $out (index.md, junit.xml)"
exit $rc
