#!/usr/bin/env bash
# Device time is scarce (30 minutes a session) and a build there spends minutes of it, while nvcc
# builds sm_90a code here without a GPU. So: build here, carry the stripped binaries, run there.
#   here:   bash tools/device/prebuilt.sh pack [BUILD_DIR]   (default build/) -> .devbin/
#   there:  bash tools/device/prebuilt.sh run [STAGE...]     (device tool, carry [".devbin"])
# The stripped binaries go into .devbin/bins.tar.xz (~25 MB: the device tool carries 64 MiB at
# most, the binaries alone are ~120 MB); run unpacks them.
# Stages (default: tests sanitize ab bench; tp needs two GPUs, e.g. nvidia-h200-x2; qbench and
# qsanitize are the quantized linears' bench and sanitizer runs; kv the quantized KV cache's):
#   tp        the NCCL tensor-parallel tests, three rounds of fresh seeds, then memcheck (memory
#             errors only: NCCL's own probes return API errors it handles) and racecheck
#   tpengine  the engine at TP = 2 / 4 against the reference (test_gpu_engine_tp, its TP-numerics
#             tables), `qparity engine tp-report` on a small fp8-block fixture (needs 2 GPUs;
#             TP = 4 where 4 are visible)
#   tpsanitize memcheck + racecheck over the TP graph-decode test (NCCL collectives in graphs)
#   tpbench   bench_engine_tp: Llama-3-8B shape bf16 / fp8-block at TP = 2 against TP = 1, the
#             Llama-3-70B shape fp8-block at TP = QP_TP70 (default 2)
#   tests     every gpu suite (on a one-GPU machine the tp suite skips, saying why)
#   sanitize  memcheck + racecheck over the skinny GEMM and decode attention tests
#   ab        batch-1 decode of the 0.6B shape, the single-pass skinny GEMM off / on, three rounds
#   bench     the full bench_engine
#   moebench  bench_engine on the Qwen3-30B-A3B shape, experts bf16 / fp8-block / w4a16-g32
#   esanitize memcheck + racecheck over the quantized-experts engine test (grouped launches)
#   kv        bench_kv_attention, then memcheck and racecheck over the KV-cache suite
#   validate  `qparity validate` on the embedded fixtures (QP_SCHEMES: a scheme list, default
#             all), its engine rows and failures printed; the reports stay on the device
#   judgematrix the judge's confusion matrix on the trained fixtures in six schemes (three
#             judge-matrix runs in parallel); the cells not as expected printed
#   imagetext `validate --model` on generated Qwen3.5 and Qwen3-VL small fixtures (their engine
#             rows), then an image prompt through the CLI: golden make --pixels, engine run
#             --pixels (free run) and --local (layer-local) reported by the bf16 engine policy,
#             engine layer on the deepstack layers, bisect with re-runs; the reports come back
#             as one archive
# Built on Debian 12 (glibc 2.36, libstdc++ of g++ 12, libhdf5_serial.so.103), the binaries run on
# the device image (Ubuntu 24.04: newer glibc and libstdc++, the same HDF5 soname). At most 8
# files come back from $OUT, so each stage writes one log.
set -uo pipefail
bins=(tests/gpu/test_gpu_kernels tests/gpu/test_gpu_engine tests/gpu/test_gpu_codecs
      tests/gpu/test_gpu_tensor_parallel tests/gpu/test_gpu_quant_linears
      tests/gpu/test_gpu_engine_quantized tests/gpu/test_gpu_kv_cache tests/gpu/test_gpu_engine_tp
      bench/bench_engine bench/bench_engine_tp bench/bench_quant_linears bench/bench_kv_attention)
cmd=${1:-}
shift || true
case "$cmd" in
pack)
  build=${1:-build}
  rm -rf .devbin && mkdir -p .devbin/stage
  for b in "${bins[@]}" tools/qparity/qparity; do
    [ -x "$build/$b" ] || { echo "prebuilt: $build/$b missing (build it first)" >&2; exit 1; }
    strip -o ".devbin/stage/$(basename "$b")" "$build/$b"
  done
  # qparity finds its policies beside the binary.
  cp -r "$build/tools/qparity/policies" .devbin/stage/
  (cd .devbin/stage && tar cJf ../bins.tar.xz -- *) && rm -rf .devbin/stage
  # The tests read policies from the source tree whose path the build baked in (QPARITY_SOURCE_DIR).
  (cd "$(dirname "$0")/../.." && pwd) > .devbin/source_dir
  du -sh .devbin
  ;;
run)
  OUT=${OUT:-/tmp/qparity-out}
  mkdir -p "$OUT"
  source "$(dirname "$0")/sanitizer_flags.sh"
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  B=$PWD/.devbin
  [ -f "$B/bins.tar.xz" ] && tar xJf "$B/bins.tar.xz" -C "$B"
  baked=$(cat "$B/source_dir")
  if [ "$baked" != "$PWD" ]; then mkdir -p "$(dirname "$baked")" && ln -sfn "$PWD" "$baked"; fi
  nvidia-smi --query-gpu=index,name,compute_cap,driver_version,memory.total --format=csv \
    | tee "$OUT/device.txt"
  rc=0
  for b in "$B"/test_* "$B"/bench_*; do
    ldd "$b" | grep -q 'not found' && { echo "prebuilt: $b lacks libraries:"; ldd "$b" | grep 'not found'; rc=1; }
  done
  [ $rc -eq 0 ] || exit 1
  # sanitize LOG BINARY [ARGS...]: memcheck then racecheck, appended to LOG, each summary printed.
  sanitize() {
    local log=$1 tool
    shift
    for tool in memcheck racecheck; do
      # shellcheck disable=SC2046
      timeout 300 compute-sanitizer --tool $tool $(sanitizer_flags "$1" $tool) --error-exitcode 9 \
        "$@" >> "$log" 2>&1 || rc=1
      echo "$tool: $(grep -E 'SUMMARY' "$log" | tail -1)"
    done
  }
  stages=("$@")
  [ ${#stages[@]} -eq 0 ] && stages=(tests sanitize ab bench)
  for s in "${stages[@]}"; do
    echo "== $s $(date +%T)"
    case "$s" in
    tp)
      NCCL_DEBUG=VERSION timeout 120 "$B/test_gpu_tensor_parallel" --gtest_repeat=3 > "$OUT/tp.log" 2>&1 || rc=1
      grep -E 'NCCL version|OK \]|FAILED|SKIPPED \]|PASSED' "$OUT/tp.log" | sort | uniq -c
      sanitize "$OUT/tp-sanitizer.log" "$B/test_gpu_tensor_parallel"
      ;;
    tpengine)
      timeout 480 "$B/test_gpu_engine_tp" > "$OUT/tpengine.log" 2>&1 || rc=1
      grep -E 'OK \]|FAILED|SKIPPED \]|PASSED|Failure' "$OUT/tpengine.log" | sort | uniq -c
      fx=/tmp/qparity-tp-fixture
      rm -rf "$fx"
      { "$B/qparity" make-fixture --arch llama --size small --scheme fp8-block --seed 3 --out "$fx" &&
        timeout 240 "$B/qparity" engine tp-report --model "$fx" --tp 2 --synthetic 2 --seq-len 64 \
          --reference --json "$OUT/tp-report.json"; } > "$OUT/tp-report.log" 2>&1 || rc=1
      grep -vE '^qparity (engine|golden)' "$OUT/tp-report.log" | tail -60
      ;;
    tpsanitize)
      sanitize "$OUT/tp-sanitizer.log" "$B/test_gpu_engine_tp" --gtest_filter='*GraphDecode*'
      ;;
    tpbench)
      timeout 540 "$B/bench_engine_tp" --tp 2 --runs llama3-8b/bf16,llama3-8b/fp8-block \
        --json "$OUT/tpbench.json" > "$OUT/tpbench.log" 2>&1 || rc=1
      timeout 300 "$B/bench_engine_tp" --tp "${QP_TP70:-2}" --runs llama3-70b/fp8-block --batches 1 \
        --steps 32 --json "$OUT/tpbench70.json" >> "$OUT/tpbench.log" 2>&1 || rc=1
      cat "$OUT/tpbench.log"
      ;;
    tests)
      for t in "$B"/test_*; do
        # Each suite's summary from its own output: a suite that dies before gtest's summary
        # must not show the previous suite's line.
        out=$(timeout 300 "$t" 2>&1)
        src=$?
        printf '%s\n' "$out" >> "$OUT/tests.log"
        [ $src -eq 0 ] || rc=1
        summary=$(grep -E '^\[  (PASSED|FAILED) ' <<< "$out" | tail -1)
        echo "$(basename "$t"): ${summary:-no gtest summary} (exit $src)"
      done
      grep -hE "worst point|bit-identical|needs 2 GPUs" "$OUT/tests.log" | sort -u
      ;;
    sanitize)
      sanitize "$OUT/sanitizer.log" "$B/test_gpu_kernels" --gtest_filter='*Skinny*:*DecodeAttention*'
      ;;
    ab)
      for r in 1 2 3; do
        for sp in off on; do
          out=$(QPARITY_SKINNY_SINGLE_PASS=$sp timeout 60 "$B/bench_engine" --models qwen3-0.6b \
            --no-linears --batches 1 --steps 128 --prefill 512 2>&1)
          src=$?
          line=$(grep -m1 'decode batch 1:' <<< "$out")
          echo "single_pass=$sp ${line:-no result (exit $src): $(tail -1 <<< "$out")}"
        done
      done | tee "$OUT/ab.log"
      ;;
    qsanitize)
      sanitize "$OUT/qsanitizer.log" "$B/test_gpu_quant_linears"
      ;;
    qbench)
      timeout 300 "$B/bench_quant_linears" > "$OUT/qbench.log" 2>&1 || rc=1
      timeout 120 python3 tools/device/bench_int_mm.py >> "$OUT/qbench.log" 2>&1 || rc=1
      cat "$OUT/qbench.log"
      ;;
    kv)
      timeout 120 "$B/bench_kv_attention" > "$OUT/kvbench.log" 2>&1 || rc=1
      cat "$OUT/kvbench.log"
      sanitize "$OUT/kvsanitizer.log" "$B/test_gpu_kv_cache"
      ;;
    validate)
      timeout 540 "$B/qparity" validate --schemes "${QP_SCHEMES:-all}" --out /tmp/qparity-reports \
        > "$OUT/validate.log" 2>&1 || rc=1
      grep -E 'engine vs reference|no engine row|^qparity validate: FAIL' "$OUT/validate.log"
      ;;
    judgematrix)
      # The judge's confusion matrix (tools/judge/judge_matrix.sh) over the trained fixtures in
      # six schemes, three groups at once on the host's cores; each group's judge-matrix.md /
      # .json come back, its log stays in /tmp/qparity-judge.
      groups=("bf16 ct-w4a16-g128" "fp8-block w8a16-ch" "w8a8-int8-dyn nvfp4a16")
      i=0
      mkdir -p /tmp/qparity-judge
      for g in "${groups[@]}"; do
        # shellcheck disable=SC2086
        OMP_NUM_THREADS=5 timeout 560 bash tools/judge/judge_matrix.sh "$B/qparity" \
          "/tmp/qparity-judge/$i" $g > "/tmp/qparity-judge/$i.log" 2>&1 &
        i=$((i + 1))
      done
      wait
      for j in $(seq 0 $((i - 1))); do
        cp "/tmp/qparity-judge/$j/judge-matrix.md" "$OUT/judge-matrix-$j.md" 2>/dev/null || rc=1
        cp "/tmp/qparity-judge/$j/judge-matrix.json" "$OUT/judge-matrix-$j.json" 2>/dev/null || rc=1
        grep -E '^qparity judge-matrix' "/tmp/qparity-judge/$j.log" | grep -vE ' -> (caught|PASS|n/a)$'
      done
      ;;
    imagetext)
      w=/tmp/qparity-imagetext
      log=$OUT/imagetext.log
      rm -rf "$w" && mkdir -p "$w/reports"
      # run NAME CMD...: the command's output to the log, its exit status printed (3 = a FAIL row).
      run() {
        local name=$1
        shift
        echo "--- $name: $*" >> "$log"
        timeout 240 "$@" >> "$log" 2>&1
        local st=$?
        echo "$name: exit $st"
        [ $st -eq 0 ] || [ $st -eq 3 ] || rc=1
      }
      for arch in qwen3.5 qwen3-vl; do
        run "make-fixture $arch" "$B/qparity" make-fixture --arch $arch --size small --seed 3 \
          --out "$w/$arch"
        run "validate $arch" "$B/qparity" validate --model "$w/$arch" --out "$w/reports/validate"
      done
      grep -E 'engine vs reference|no engine row|skipped' "$log"
      vl=$w/qwen3-vl
      run "image prompt" python3 tools/peers/make_image_prompt.py --model "$vl" \
        --pixels "$w/pixels.safetensors" --tokens "$w/tokens.txt"
      ids=$(cat "$w/tokens.txt")
      run "golden make --pixels" "$B/qparity" golden make --model "$vl" --token-ids "$ids" \
        --pixels "$w/pixels.safetensors" --mode emulate --dialect vllm --out "$w/golden.h5"
      run "engine run --pixels" "$B/qparity" engine run --model "$vl" --token-ids "$ids" \
        --pixels "$w/pixels.safetensors" --dump "$w/free.h5"
      run "report free run" "$B/qparity" report "$w/golden.h5" "$w/free.h5" --role engine \
        --out "$w/reports/image-free"
      run "engine run --local" "$B/qparity" engine run --model "$vl" --local "$w/golden.h5" \
        --dump "$w/local.h5"
      run "report layer-local" "$B/qparity" report "$w/golden.h5" "$w/local.h5" --role engine \
        --out "$w/reports/image-local"
      for layer in 0 1 2; do
        run "engine layer $layer" "$B/qparity" engine layer --model "$vl" --golden "$w/golden.h5" \
          --layer $layer
      done
      run "bisect free run" "$B/qparity" bisect "$w/golden.h5" "$w/free.h5" --model "$vl"
      grep -E 'verdict|PASS|FAIL|KLD|top-1|worst|LOCAL|INHERITED' "$log" | grep -v '^qparity validate: \[' | tail -60
      tar czf "$OUT/imagetext-reports.tgz" -C "$w" reports
      ;;
    moebench)
      # Qwen3-30B-A3B shape, experts bf16 / fp8-block / w4a16-g32, decode batch 1 and 16.
      timeout 540 "$B/bench_engine" --models qwen3-30b-a3b --no-linears --batches 1,16 \
        --steps 32 --context 512 --prefill 512 --json "$OUT/moebench.json" > "$OUT/moebench.log" 2>&1 || rc=1
      grep -E 'copy|decode batch|prefill .* tokens/s' "$OUT/moebench.log"
      ;;
    esanitize)
      sanitize "$OUT/esanitizer.log" "$B/test_gpu_engine_quantized" --gtest_filter='*QuantizedExperts*'
      ;;
    bench)
      timeout 300 "$B/bench_engine" > "$OUT/bench.log" 2>&1 || rc=1
      grep -E 'copy|decode batch|prefill .* tokens/s' "$OUT/bench.log"
      ;;
    *) echo "prebuilt: unknown stage '$s'" >&2; rc=2 ;;
    esac
  done
  exit $rc
  ;;
*)
  echo "usage: prebuilt.sh pack [BUILD_DIR] | run [tp|tests|sanitize|ab|bench|moebench|qsanitize|esanitize|qbench|kv|validate|imagetext ...]" >&2
  exit 2
  ;;
esac
