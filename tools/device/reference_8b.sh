#!/usr/bin/env bash
# Issue 54's targets on the device machine's CPUs (16 cores; a CPU-only run is allowed there):
#   1. bench_reference_forward at 1..16 threads (the small fixtures' prefill and decode against
#      Eigen's fp64 GEMM in the same run, and a Llama-3-8B-shaped layer's linears);
#   2. a Llama-3-8B-shaped checkpoint (make-fixture --shape llama3-8b, 32 layers, random bf16)
#      through `golden make`, 16 x 128 tokens at --memory-budget 8G, wall time and peak RSS
#      (tools/device/peak_rss.py). Target: <= 15 minutes, peak RSS <= the budget + 10 %.
#   Q=qparity B=bench_reference_forward bash tools/device/reference_8b.sh [bench|golden]...
set -u
: "${Q:?Q=qparity binary}" "${B:?B=bench_reference_forward binary}"
here=$(cd "$(dirname "$0")" && pwd)
W=${W:-/tmp/ref8b}
stages=${*:-bench golden}
lscpu | grep -E "^Model name|^CPU\(s\)|^Thread|^Core|^Socket|^NUMA node|^L3" | sed 's/  */ /g'
if grep -qw avx512f /proc/cpuinfo; then echo "vector units: AVX-512"; elif grep -qw avx2 /proc/cpuinfo; then
  echo "vector units: AVX2"; else echo "vector units: neither AVX2 nor AVX-512"; fi
for s in $stages; do
  case "$s" in
  bench)
    echo "== bench_reference_forward"
    "$B" --threads "${THREADS:-1,2,4,8,16}" --tokens "${TOKENS:-64}" --repeats 2 \
      --archs "${ARCHS:-llama,qwen3-moe}" --schemes "${SCHEMES:-bf16,w8a16-ch,fp8-block,w4a16-g32,nvfp4}" \
      --layer-8b 1
    ;;
  golden)
    mkdir -p "$W"
    if [ ! -f "$W/bf16/config.json" ]; then
      python3 "$here/peak_rss.py" "make-fixture llama3-8b" -- \
        "$Q" make-fixture --shape llama3-8b --seed 1 --out "$W/bf16" 2>&1 | tail -2
    fi
    du -sh "$W/bf16"
    sync; echo 1 > /proc/sys/vm/drop_caches 2>/dev/null || true
    python3 "$here/peak_rss.py" "golden make 16x128 budget 8G" -- \
      "$Q" golden make --model "$W/bf16" --synthetic 16 --seq-len 128 --memory-budget 8G \
      --out "$W/g.h5" --force 2>&1 | tail -4
    ls -la "$W/g.h5"
    ;;
  *) echo "reference_8b: unknown stage $s (bench, golden)"; exit 2 ;;
  esac
done
