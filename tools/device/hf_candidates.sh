#!/usr/bin/env bash
# Hugging Face transformers judged as a foreign engine, on the GPU image (torch, transformers).
# Stages (default: all): tests (the Python package's tests, torch ones included), rows (per
# fixture architecture: the fp64 golden, the bf16 candidate of `python -m qparity_dump hf`,
# compare, the qparity engine's rows and the hf-transformers row in one report set), diag (llama
# with eager attention and in float32, to place its bf16 error), faults (two planted faults
# bisected), fp8 (transformers' fine-grained FP8 on an fp8-block checkpoint). Needs `qparity`
# and its policies in .devbin/ (copy build/tools/qparity/policies). Outputs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
Q=${QPARITY:-$PWD/.devbin/qparity}
OUT=${OUT:-/tmp/hf-out}
W=${HF_WORK:-/tmp/hf-work}
export PYTHONPATH=$PWD/python
mkdir -p "$OUT" "$W"
stages=${*:-tests rows diag faults fp8}
has() { [[ " $stages " == *" $1 "* ]]; }
python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name(0))"
fixture() {  # arch -> $W/arch (+ golden), once
  local arch=$1 size=small
  [ "$arch" = qwen3-moe ] && size=tiny
  [ -d "$W/$arch" ] && return
  "$Q" make-fixture --arch "$arch" --size $size --seed 1 --out "$W/$arch" 2>/dev/null
  "$Q" golden make --model "$W/$arch" --synthetic 4 --seq-len 32 --out "$W/$arch.golden.h5" 2>/dev/null
}
hf() { python -m qparity_dump hf --model "$1" --tokens "$2" --out "$3" --device cuda --force "${@:4}"; }
if has tests; then
  python -m unittest discover -s python/tests -v > "$OUT/python-tests.txt" 2>&1
  echo "python tests: exit $?"; grep -E "^Ran|^OK|FAILED|Error" "$OUT/python-tests.txt" | head
fi
if has rows; then
  for arch in llama qwen3 qwen3-moe; do
    fixture $arch
    hf "$W/$arch" "$W/$arch.golden.h5" "$W/$arch.hf.h5" --dtype bf16
    "$Q" compare "$W/$arch.golden.h5" "$W/$arch.hf.h5" --policy policies/bf16.json \
      > "$OUT/$arch.compare-vs-exact.txt"; echo "$arch: hf bf16 vs the fp64 exact golden: exit $?"
    "$Q" validate --model "$W/$arch" --schemes fp8-block --out "$OUT/reports" 2>&1 | grep -E "engine vs"
    "$Q" validate --model "$W/$arch" --candidate "$W/$arch.hf.h5" --out "$OUT/reports" 2>&1 | grep -E ": (PASS|FAIL|NOT)|  end to end"
    # what the row compared, point by point: the emulate-mode bf16 golden validate makes
    # (the same default seed as the golden above: the same tokens)
    "$Q" golden make --model "$W/$arch" --synthetic 4 --seq-len 32 --mode emulate --run-dtype bf16 \
      --out "$W/$arch.emulate.h5" --force 2>/dev/null
    "$Q" compare "$W/$arch.emulate.h5" "$W/$arch.hf.h5" --policy policies/bf16.json \
      > "$OUT/$arch.compare-vs-emulate.txt"
  done
  (cd "$OUT/reports" && tar czf "$OUT/reports.tgz" . && cp index.md "$OUT/index.md")
fi
if has diag; then
  fixture llama
  hf "$W/llama" "$W/llama.golden.h5" "$W/llama.hf-eager.h5" --dtype bf16 --attn eager
  hf "$W/llama" "$W/llama.golden.h5" "$W/llama.hf-f32.h5" --dtype f32
  for v in hf-eager hf-f32; do
    "$Q" compare "$W/llama.golden.h5" "$W/llama.$v.h5" --policy policies/bf16.json > "$OUT/llama.$v.txt"
    echo "llama $v vs the fp64 golden: $(grep -E 'mean KLD' "$OUT/llama.$v.txt" | head -1)"
  done
  python -c "import h5py; print(' '.join(map(str, h5py.File('$W/llama.golden.h5')['inputs/tokens'][()].ravel())))" \
    > "$W/llama.tokens"
  "$Q" engine run --model "$W/llama" --tokens "$W/llama.tokens" --seq-len 32 --dump "$W/llama.engine.h5" --force >/dev/null 2>&1
  "$Q" compare "$W/llama.golden.h5" "$W/llama.engine.h5" --policy policies/bf16.json > "$OUT/llama.engine.txt"
  echo "llama qparity engine vs the fp64 golden: $(grep -E 'mean KLD' "$OUT/llama.engine.txt" | head -1)"
fi
if has faults; then
  for arch in qwen3 qwen3-moe; do fixture $arch; [ -f "$W/$arch.hf.h5" ] || hf "$W/$arch" "$W/$arch.golden.h5" "$W/$arch.hf.h5" --dtype bf16; done
  python tools/peers/hf_planted_fault.py --model "$W/qwen3" --tokens "$W/qwen3.golden.h5" \
    --out "$W/qwen3.fault.h5" --fault o_proj-scale --layer 1
  python tools/peers/hf_planted_fault.py --model "$W/qwen3-moe" --tokens "$W/qwen3-moe.golden.h5" \
    --out "$W/moe.fault.h5" --fault router-renorm
  "$Q" bisect "$W/qwen3.golden.h5" "$W/qwen3.fault.h5" --model "$W/qwen3" --policy policies/bf16.json \
    > "$OUT/bisect-o_proj-vs-golden.txt" 2>&1; echo "bisect o_proj vs the golden: exit $?"
  "$Q" bisect --candidates "$W/qwen3.hf.h5" "$W/qwen3.fault.h5" --model "$W/qwen3" \
    --policy policies/bf16.json > "$OUT/bisect-o_proj.txt" 2>&1; echo "bisect o_proj vs clean hf: exit $?"
  "$Q" bisect "$W/qwen3-moe.golden.h5" "$W/moe.fault.h5" --model "$W/qwen3-moe" \
    --policy policies/bf16.json > "$OUT/bisect-router-vs-golden.txt" 2>&1; echo "bisect router vs the golden: exit $?"
  "$Q" bisect --candidates "$W/qwen3-moe.hf.h5" "$W/moe.fault.h5" --model "$W/qwen3-moe" \
    --policy policies/bf16.json > "$OUT/bisect-router.txt" 2>&1; echo "bisect router vs clean hf: exit $?"
fi
if has fp8; then
  fixture qwen3
  "$Q" quantize --in "$W/qwen3" --scheme fp8-block --dialect vllm --out "$W/qwen3.ct-fp8" \
    --ignore-unsupported 2>&1 | tail -2
  python tools/peers/ct_fp8_block_to_hf.py "$W/qwen3.ct-fp8" "$W/qwen3.hf-fp8"
  "$Q" golden make --model "$W/qwen3.hf-fp8" --synthetic 4 --seq-len 32 --mode emulate --dialect vllm \
    --run-dtype bf16 --out "$W/qwen3.fp8.golden.h5" --force 2>/dev/null
  hf "$W/qwen3.hf-fp8" "$W/qwen3.fp8.golden.h5" "$W/qwen3.fp8.hf.h5" --dtype bf16 --dialect vllm \
    > "$OUT/fp8-dump.txt" 2>&1; echo "hf fp8 dump: exit $?"; tail -5 "$OUT/fp8-dump.txt"
  if [ -f "$W/qwen3.fp8.hf.h5" ]; then
    "$Q" compare "$W/qwen3.fp8.golden.h5" "$W/qwen3.fp8.hf.h5" > "$OUT/fp8-compare.txt"
    echo "hf fp8 vs the emulate golden: exit $?"
    "$Q" validate --model "$W/qwen3.hf-fp8" --candidate "$W/qwen3.fp8.hf.h5" --out "$OUT/reports" 2>&1 | grep -E ": (PASS|FAIL|NOT)|  end to end"
  fi
fi
