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
log "Hugging Face transformers peer: float64 (patched) must agree to 1e-12; stock is reported"
QP=build-device/tools/qparity/qparity
POINTS='embed,layers.*.input_norm,layers.*.attn.out,layers.*.post_attn_norm,layers.*.mlp.out,layers.*.moe.out,layers.*.residual,final_norm,logits'
for arch in llama qwen3 qwen3-moe; do
  for size in tiny small; do
    d=/tmp/peer-$arch-$size; t=/tmp/peer-$arch-$size-traces; mkdir -p $t
    $QP make-fixture --arch $arch --size $size --seed 7 --out $d --force 2>/dev/null || { echo "make-fixture $arch $size failed"; rc=1; continue; }
    $QP trace --model $d --synthetic 24 --seed 11 --capture "$POINTS" --out $t/ref.safetensors --force 2>/dev/null
    for mode in patched stock; do
      flag=""; [ $mode = stock ] && flag="--stock"
      python3 tools/peers/hf_reference.py --model $d --tokens-from $t/ref.safetensors --out $t/hf-$mode.safetensors $flag > $t/hf-$mode.log 2>&1 \
        || { echo "hf_reference $arch $size $mode failed:"; tail -5 $t/hf-$mode.log; rc=1; continue; }
      bound=1e-12; [ $mode = stock ] && bound=1
      python3 tools/peers/compare_traces.py $t/ref.safetensors $t/hf-$mode.safetensors --bound $bound \
        --json "$OUT/peer-$arch-$size-$mode.json" > $t/cmp-$mode.log 2>&1; prc=$?
      echo "peer $arch $size $mode: $(tail -1 $t/cmp-$mode.log)"
      [ $mode = patched ] && [ $prc -ne 0 ] && { rc=1; sort -g $t/cmp-$mode.log | tail -4; }
    done
  done
done
exit $rc
