#!/usr/bin/env bash
# qparity as its users get it: install this build into a fresh prefix, configure and build
# examples/downstream against it with find_package(qparity), run its ctest, and check what the
# accuracy tests leave: PASS rows for the correct engine, the planted fault's FAIL with its
# JUnit failure and bisect's verdict. The reports stay in <build>/downstream-example/reports.
#   downstream_example.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
root=$build/downstream-example
rm -rf "$root"
mkdir -p "$root"
cmake --install "$build" --prefix "$root/prefix" >"$root/install.log"
cmake -S "$src/examples/downstream" -B "$root/build" -DCMAKE_PREFIX_PATH="$root/prefix" \
  -DCMAKE_BUILD_TYPE=Release >"$root/configure.log" ||
  { cat "$root/configure.log"; exit 1; }
cmake --build "$root/build" -j2 >"$root/build.log" || { cat "$root/build.log"; exit 1; }
ctest --test-dir "$root/build" --output-on-failure | tee "$root/ctest.log"
reports=$root/build/qparity-reports

fail() { echo "downstream_example: $*" >&2; exit 1; }
for scheme in bf16 W8A16; do
  junit=$reports/cpu-engine/$scheme/junit.xml
  [ -f "$junit" ] || fail "no $junit"
  grep -q '<testcase ' "$junit" || fail "$junit has no test case"
  ! grep -q '<failure\|<skipped' "$junit" || fail "$junit: the correct engine did not PASS"
  ls "$reports/cpu-engine/$scheme"/*/*/*.md >/dev/null || fail "no report under cpu-engine/$scheme"
done
fault=$reports/cpu-engine-planted-fault/bf16
grep -q '<failure type="FAIL"' "$fault/junit.xml" || fail "the planted fault's JUnit holds no FAIL"
[ -s "$fault/bisect.txt" ] || fail "no bisect output beside the planted fault's report"
grep -q 'layers\.1\.' "$fault/bisect.txt" || fail "bisect did not name layer 1: $(cat "$fault/bisect.txt")"
grep -Eq 'LOCAL|INHERITED|UNDECIDED' "$fault/bisect.txt" || fail "bisect printed no verdict"
if grep -q 'gpu-engine' "$root/ctest.log" && ! command -v nvidia-smi >/dev/null; then
  grep -q 'gpu-engine.*Skipped' "$root/ctest.log" || fail "the GPU rows did not skip without a GPU"
fi
echo "downstream_example: PASS rows, the expected FAIL and bisect's verdict are in $reports"
