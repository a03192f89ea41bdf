#!/usr/bin/env bash
# One device call does everything that needs the GPU image: build (CUDA included), regenerate the
# torch-written safetensors fixture, run every ctest label (gpu tests run for real there), and
# compute-sanitizer over the gpu tests. Results land in $OUT (fetched back by the device tool).
set -uo pipefail
OUT=${OUT:-/tmp/qparity-out}
mkdir -p "$OUT"
log() { echo "== $*"; }
log "device"; nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv | tee "$OUT/device.txt"
log "configure + build"
cmake -S . -B build-device -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQPARITY_CUDA_ARCHS=90a > "$OUT/configure.log" 2>&1 \
  || { tail -40 "$OUT/configure.log"; exit 1; }
cmake --build build-device -j16 > "$OUT/build.log" 2>&1 || { grep -E "error|Error" "$OUT/build.log" | head -40; exit 1; }
log "torch fixture"
python3 tools/device/make_torch_safetensors_fixture.py "$OUT/torch_saved.safetensors" \
  && mkdir -p tests/data && cp "$OUT/torch_saved.safetensors" tests/data/torch_saved.safetensors
log "ctest (all labels)"
ctest --test-dir build-device -j8 --output-on-failure --output-junit "$OUT/ctest-junit.xml" > "$OUT/ctest.log" 2>&1
rc=$?
tail -25 "$OUT/ctest.log"
log "gpu tests verbose"
for t in build-device/tests/gpu/test_*; do [ -x "$t" ] && "$t" 2>&1 | tail -6; done
log "compute-sanitizer"
for tool in memcheck racecheck; do
  for t in build-device/tests/gpu/test_*; do
    [ -x "$t" ] || continue
    compute-sanitizer --tool "$tool" --error-exitcode 9 "$t" > "$OUT/sanitizer-$tool-$(basename "$t").log" 2>&1
    echo "$tool $(basename "$t"): rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer-$tool-$(basename "$t").log" | tail -1)"
  done
done
log "quantization cross-checks (torch / ml_dtypes peers)"
python3 tools/device/crosscheck_quant.py build-device/tools/qparity/qparity "$OUT" > "$OUT/crosscheck_quant.log" 2>&1
xrc=$?
cat "$OUT/crosscheck_quant.log" | tail -40
[ $rc -eq 0 ] && rc=$xrc
exit $rc
