#!/usr/bin/env bash
# The quantized GPU paths on a device, in one call (device tool, carry [".devbin"], after
# prebuilt.sh pack and a copy of build/tools/qparity/qparity and its policies into .devbin/): the
# gpu suites, the sanitizers and bench of the quantized linears, the planted-fault bisect chain
# (QPARITY_TEST_FAULT), and validate's engine rows.
set -u
B=$PWD/.devbin
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
bash tools/device/prebuilt.sh run ${STAGES:-tests qsanitize qbench} 2>&1 | tail -60
Q=$B/qparity; W=/tmp/demo; mkdir -p $W
echo "== bisect demo $(date +%T)"
$Q make-fixture --arch qwen3 --seed 4 --out $W/fp > /dev/null 2>&1
$Q quantize --in $W/fp --scheme w4a16-g32 --out $W/q > /dev/null 2>&1
$Q golden make --model $W/q --mode emulate --synthetic 2 --seq-len 16 --out $W/ref.h5 > /dev/null 2>&1
QPARITY_TEST_FAULT=weight-only-group-off-by-one $Q engine run --model $W/q --local $W/ref.h5 --dump $W/bad.h5 2>&1 | tail -3
QPARITY_TEST_FAULT=weight-only-group-off-by-one $Q bisect $W/ref.h5 $W/bad.h5 --model $W/q 2>&1 | tail -25
QPARITY_TEST_FAULT=weight-only-group-off-by-one $Q engine layer --model $W/q --golden $W/ref.h5 --layer 0 2>&1 | tail -25
echo "== without the fault"
$Q engine run --model $W/q --local $W/ref.h5 --dump $W/good.h5 > /dev/null 2>&1
$Q compare $W/ref.h5 $W/good.h5 2>&1 | tail -6
echo "== validate $(date +%T)"
$Q validate --schemes all --out $W/reports --sequences 2 --seq-len 16 2>&1 | grep -E "engine|no engine row|FAIL|error" | head -90
