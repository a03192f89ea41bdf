#!/usr/bin/env bash
# Device work in stages, so each call stays under the device tool's 10-minute limit; the build
# directory persists between calls on a warm machine. Results land in $OUT.
#   bash tools/device/run.sh [STAGE...]     default: build test sanitize crosscheck peer vision images bench
#   build      configure + build everything (CUDA included), -j16
#   test       the torch-written fixture, every ctest label (gpu tests run for real), JUnit XML;
#              CTEST_ARGS="-L gpu" narrows it
#   sanitize   compute-sanitizer memcheck + racecheck over the gpu tests
#   crosscheck quantization cross-checks against torch / ml_dtypes
#   vision     Qwen3-VL's / Qwen3.5's vision tower (`qparity trace-vision`) against transformers'
#              model.visual on the same pixel patches (float64 patched, stock)
#   images     image prompts (`qparity trace --pixels`: tower, placeholders, M-RoPE, deepstack)
#              against the checkpoint class's own forward (float64 patched, stock)
#   peer       the Hugging Face transformers peer of the reference (float64 patched, stock), about
#              10 minutes on the H200 image: PEER_ARCHS / PEER_IMAGE_TEXT (space-separated) narrow it
#   bench      bench_engine (engine vs copy bandwidth) and tools/device/bench_hf.py (HF peer)
#   decode-study  batch-1 decode of the 0.6B/8B shapes: the kernel timeline of a step and the
#              decode attention's per-block stages, the step with attention or the linears left
#              out (what each costs inside the graph),
#              and bench_dependent_chain (the per-kernel floor of a dependent chain)
set -uo pipefail
source "$(dirname "$0")/sanitizer_flags.sh"
OUT=${OUT:-/tmp/qparity-out}
mkdir -p "$OUT"
log() { echo "== $*"; }
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(build test sanitize crosscheck peer vision images bench)
want() { local s; for s in "${stages[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
rc=0
log "device"; nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv | tee "$OUT/device.txt"
if want build; then
  log "configure + build"
  # NCCL: FindNCCL finds the CUDA toolkit's on the image (an NCCL_ROOT in the environment
  # overrides it). The pip package's lookup that stood here never fired: nvidia.nccl is a
  # namespace package with no __file__.
  cmake -S . -B build-device -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQPARITY_CUDA_ARCHS=90a > "$OUT/configure.log" 2>&1 \
    || { tail -40 "$OUT/configure.log"; exit 1; }
  cmake --build build-device -j16 > "$OUT/build.log" 2>&1 || { grep -E "error|Error" "$OUT/build.log" | head -40; exit 1; }
fi
if want test; then
  log "torch fixture"
  python3 tools/device/make_torch_safetensors_fixture.py "$OUT/torch_saved.safetensors" \
    && mkdir -p tests/data && cp "$OUT/torch_saved.safetensors" tests/data/torch_saved.safetensors
  log "ctest (all labels)"
  # shellcheck disable=SC2086
  ctest --test-dir build-device -j8 ${CTEST_ARGS:-} --output-on-failure --output-junit "$OUT/ctest-junit.xml" > "$OUT/ctest.log" 2>&1 || rc=1
  tail -25 "$OUT/ctest.log"
  log "gpu tests verbose"
  for t in build-device/tests/gpu/test_*; do [ -x "$t" ] && "$t" > "$OUT/$(basename "$t").log" 2>&1; tail -12 "$OUT/$(basename "$t").log"; done
  grep -hE "worst point|bit-identical" "$OUT"/test_gpu_engine.log
fi
if want sanitize; then
  log "compute-sanitizer (engine tests on the tiny fixtures)"
  for tool in memcheck racecheck; do
    for t in build-device/tests/gpu/test_*; do
      [ -x "$t" ] || continue
      # host-only logic makes no CUDA call: the sanitizer has nothing to watch and refuses it
      [ "$(basename "$t")" = test_engine_host_logic ] && continue
      filter='*'
      [ "$(basename "$t")" = test_gpu_engine ] && filter='*PrefillAndDecode*:*LayerRerun*:*NanRouter*:*DecodeIsReproducible*'
      log_file="$OUT/sanitizer-$tool-$(basename "$t").log"
      # shellcheck disable=SC2046
      compute-sanitizer --tool "$tool" $(sanitizer_flags "$t" "$tool") --error-exitcode 9 "$t" --gtest_filter="$filter" > "$log_file" 2>&1
      src=$?
      if [ "$tool" = racecheck ] && [ $src -ne 0 ]; then
        # racecheck does not model the TMA / mbarrier synchronization of cuBLASLt's sm90 "nvjet"
        # GEMM kernels and reports hazards inside them (excluding those kernels makes the tool
        # itself fail). Ours must have none: any reported race outside nvjet fails the stage.
        ours=$(grep -E "Race reported" "$log_file" | grep -vc nvjet)
        nvjet=$(grep -E "Race reported" "$log_file" | grep -c nvjet)
        echo "$tool $(basename "$t") [$filter]: $nvjet hazard reports inside cuBLASLt nvjet kernels, $ours elsewhere"
        [ "$ours" -ne 0 ] && rc=1
        grep -q "Internal Sanitizer Error" "$log_file" && { echo "  sanitizer internal error"; rc=1; }
        grep -q "\[  FAILED  \]" "$log_file" && { echo "  a test failed under the sanitizer"; rc=1; }
        continue
      fi
      [ $src -ne 0 ] && rc=1
      echo "$tool $(basename "$t") [$filter]: rc=$src $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log_file" | tail -1)"
    done
  done
fi
if want crosscheck; then
  log "quantization cross-checks (torch / ml_dtypes peers)"
  python3 tools/device/crosscheck_quant.py build-device/tools/qparity/qparity "$OUT" > "$OUT/crosscheck_quant.log" 2>&1 || rc=1
  tail -40 "$OUT/crosscheck_quant.log"
fi
if want bench; then
  log "bench: engine against the copy bandwidth, then HF transformers on the same shapes"
  build-device/bench/bench_engine --json "$OUT/bench_engine.json" 2>&1 | tee "$OUT/bench_engine.log"
  python3 tools/device/bench_hf.py --json "$OUT/bench_hf.json" 2>&1 | grep -v Warning | tee "$OUT/bench_hf.log"
fi
if want decode-study; then
  log "decode study: timeline, ablations (batch 1, 128 steps after 512 tokens)"
  B=build-device/bench/bench_engine
  common="--no-linears --batches 1 --steps 128 --prefill 512"
  for variant in "" "--timeline --attention-stages" "--ablate attention" "--ablate linears"; do
    # shellcheck disable=SC2086
    $B --models qwen3-0.6b $common $variant 2>&1 | grep -v -E "^device|prefill"
  done
  for variant in ""; do
    # shellcheck disable=SC2086
    $B --models llama3-8b $common $variant 2>&1 | grep "decode batch"
  done
  log "decode study: the floor of a chain of dependent kernels, and the skinny GEMM's chain cost"
  build-device/bench/bench_dependent_chain --grids 128 384 --chain 56
fi
# The transformers peers (peer, images stages).
QP=${QP:-build-device/tools/qparity/qparity}
# Per architecture: trace refuses a pattern that matches no capture point of the model, so the
# dense models name mlp.out and Qwen3-MoE (every layer sparse) moe.out.
DENSE_POINTS='embed,layers.*.input_norm,layers.*.attn.out,layers.*.post_attn_norm,layers.*.mlp.out,layers.*.residual,final_norm,logits'
MOE_POINTS='embed,layers.*.input_norm,layers.*.attn.out,layers.*.post_attn_norm,layers.*.moe.out,layers.*.residual,final_norm,logits'
# Qwen3.5: the Gated DeltaNet's delta-rule and gated-norm outputs and the gated attention's o_proj
# input too (transformers' prefill runs the chunked form of the rule: the peer checks ours).
QWEN35_POINTS="$DENSE_POINTS"',layers.*.linear_attn.core,layers.*.linear_attn.norm,layers.*.attn.gated'
points_of() {
  case $1 in qwen3-moe|gpt-oss*) echo "$MOE_POINTS" ;; qwen3.5*) echo "$QWEN35_POINTS" ;; *) echo "$DENSE_POINTS" ;; esac
}
# trace_and_compare NAME DIR ARCH [T]: qparity's trace of DIR on 24 synthetic tokens (or, with T,
# the image prompt T/tokens.txt with T/pixels.safetensors), then transformers on the same input in
# float64 patched (must agree to 1e-12) and stock (reported).
trace_and_compare() {
  local name=$1 d=$2 arch=$3 t=${4:-$2-traces} mode flag bound prc input hf_input="" capture
  mkdir -p $t
  capture=$(points_of $arch)
  if [ -n "${4:-}" ]; then
    input="--token-ids $(cat $t/tokens.txt) --pixels $t/pixels.safetensors"
    capture="$capture,visual.*"
    hf_input="--pixels $t/pixels.safetensors"
  else
    input="--synthetic 24 --seed 11"
  fi
  $QP trace --model $d $input --capture "$capture" --out $t/ref.safetensors --force > $t/trace.log 2>&1 \
    || { echo "qparity trace $name failed:"; tail -3 $t/trace.log; rc=1; return; }
  for mode in patched stock; do
    flag=""; [ $mode = stock ] && flag="--stock"
    python3 tools/peers/hf_reference.py --model $d --tokens-from $t/ref.safetensors $hf_input --out $t/hf-$mode.safetensors $flag > $t/hf-$mode.log 2>&1 \
      || { echo "hf_reference $name $mode failed:"; tail -5 $t/hf-$mode.log; rc=1; continue; }
    bound=1e-12; [ $mode = stock ] && bound=1
    python3 tools/peers/compare_traces.py $t/ref.safetensors $t/hf-$mode.safetensors --bound $bound \
      --json "$OUT/peer-$name-$mode.json" > $t/cmp-$mode.log 2>&1; prc=$?
    echo "peer $name $mode: $(tail -1 $t/cmp-$mode.log)"
    [ $mode = patched ] && [ $prc -ne 0 ] && { rc=1; sort -g $t/cmp-$mode.log | tail -4; }
  done
}
# image_text_checkpoint DIR: the image-text checkpoints the images and vision stages run (the
# qwen3-vl fixture tiny / small, transformers-saved Qwen3-VL / Qwen3.5), made when missing.
IMAGE_TEXT_DIRS="/tmp/peer-qwen3-vl-tiny /tmp/peer-qwen3-vl-small /tmp/peer-qwen3-vl /tmp/peer-qwen3.5-vl"
image_text_checkpoint() {
  local d=$1
  case $d in
    *-tiny|*-small) [ -d $d ] || $QP make-fixture --arch qwen3-vl --size ${d##*-} --seed 7 --out $d --force > /dev/null 2>&1 ;;
    *) [ -d $d ] || python3 tools/peers/make_hf_image_text.py --arch ${d#/tmp/peer-} --out $d > /dev/null 2>&1 ;;
  esac
  [ -d $d ]
}
if want peer; then
log "Hugging Face transformers peer: float64 (patched) must agree to 1e-12; stock is reported"
for arch in ${PEER_ARCHS:-llama qwen3 qwen3-moe mistral qwen3.5 qwen3-vl gpt-oss}; do
  for size in tiny small; do
    d=/tmp/peer-$arch-$size
    $QP make-fixture --arch $arch --size $size --seed 7 --out $d --force 2>/dev/null || { echo "make-fixture $arch $size failed"; rc=1; continue; }
    trace_and_compare "$arch-$size" $d $arch
    # gpt-oss's own MXFP4 layout (quant_method mxfp4), read by qparity and by transformers.
    if [ $arch = gpt-oss ]; then
      $QP quantize --in $d --scheme mxfp4a16 --format gpt-oss --out $d-mxfp4 --force > /dev/null 2>&1 \
        || { echo "quantize gpt-oss mxfp4 $size failed"; rc=1; continue; }
      trace_and_compare "$arch-$size-mxfp4" $d-mxfp4 $arch
    fi
  done
done
# Image-text checkpoints as transformers itself writes them (tools/peers/make_hf_image_text.py):
# the reference reads the wrapper layout and runs the language model on text.
for arch in ${PEER_IMAGE_TEXT:-qwen3-vl qwen3.5-vl}; do
  d=/tmp/peer-$arch; rm -rf $d
  python3 tools/peers/make_hf_image_text.py --arch $arch --out $d --manifest "$OUT/layout-$arch.json" > /tmp/make-$arch.log 2>&1 \
    || { echo "make_hf_image_text $arch failed:"; tail -5 /tmp/make-$arch.log; rc=1; continue; }
  tail -1 /tmp/make-$arch.log; cp $d/config.json "$OUT/config-$arch.json"
  trace_and_compare $arch $d $arch
done
fi
if want images; then
log "image prompts against transformers: tower, placeholders, M-RoPE, deepstack (float64 patched to 1e-12; stock reported)"
# Two images (one at the position table's size, one resampled) between text, run by the
# checkpoint class's own forward on the transformers side.
for d in $IMAGE_TEXT_DIRS; do
  image_text_checkpoint $d || { echo "no checkpoint $d"; rc=1; continue; }
  t=$d-images; mkdir -p $t
  arch=qwen3-vl; case $d in *qwen3.5*) arch=qwen3.5 ;; esac
  python3 tools/peers/make_image_prompt.py --model $d --pixels $t/pixels.safetensors --tokens $t/tokens.txt \
    || { echo "make_image_prompt $d failed"; rc=1; continue; }
  trace_and_compare "$(basename $d)-images" $d $arch $t
done
fi
if want vision; then
log "vision towers against transformers (float64 patched must agree to 1e-12; stock is reported)"
# The vision towers: transformers' model.visual in float64 and `qparity trace-vision` on the same
# pixel patches (three images: one at the table's size, one resampled, a two-frame video).
for d in $IMAGE_TEXT_DIRS; do
  image_text_checkpoint $d || { echo "no checkpoint $d"; rc=1; continue; }
  t=$d-vision; name=$(basename $d)-vision; mkdir -p $t
  for mode in patched stock; do
    flag=""; mk="--make-pixels"; [ $mode = stock ] && { flag="--stock"; mk=""; }
    python3 tools/peers/hf_vision_reference.py --model $d --pixels $t/pixels.safetensors $mk --out $t/hf-$mode.safetensors $flag > $t/hf-$mode.log 2>&1 \
      || { echo "hf_vision_reference $name $mode failed:"; tail -5 $t/hf-$mode.log; rc=1; break; }
    if [ $mode = patched ]; then
      $QP trace-vision --model $d --pixels $t/pixels.safetensors --out $t/ref.safetensors --force > $t/trace.log 2>&1 \
        || { echo "qparity trace-vision $name failed:"; tail -3 $t/trace.log; rc=1; break; }
    fi
    bound=1e-12; [ $mode = stock ] && bound=1
    python3 tools/peers/compare_traces.py $t/ref.safetensors $t/hf-$mode.safetensors --bound $bound \
      --json "$OUT/peer-$name-$mode.json" > $t/cmp-$mode.log 2>&1; prc=$?
    echo "peer $name $mode: $(tail -1 $t/cmp-$mode.log)"
    [ $mode = patched ] && [ $prc -ne 0 ] && { rc=1; sort -g $t/cmp-$mode.log | tail -6; }
  done
done
fi
exit $rc
