#!/usr/bin/env bash
# The engine's quantized load path changed (issue 51: no reference host model, one layer at a
# time, unquantized layers from their stored bytes): the dumps of the old and the new binary must
# be bit for bit the same on every fixture and scheme. Run on the device:
#   OLD=path/to/old/qparity NEW=path/to/new/qparity bash tools/device/loader_parity.sh
# Each fixture is quantized once (by NEW; quantize does not go through the engine), each engine
# runs a free run and a layer-local run against the same reference golden, and every dataset of
# the two dumps is compared by its bytes (tools/device/dumps_identical.py). Prints one line per
# case and a summary; exits 1 when any dump differs or either engine refuses what the other ran.
set -u
: "${OLD:?OLD=old qparity binary}" "${NEW:?NEW=new qparity binary}"
W=${W:-/tmp/loader_parity}
rm -rf "$W" && mkdir -p "$W"
here=$(cd "$(dirname "$0")" && pwd)
archs=${ARCHS:-"llama qwen3 qwen3-moe mistral chatglm2 qwen3.5"}
schemes=${SCHEMES:-"fp8-block fp8-channel fp8-tensor ct-w4a16-g128 ct-w4a16-g128-asym w4a16-g32 ct-w8a16-ch w8a16-ch w8a8-static w8a8-int8-dyn w4a8-dyn nvfp4 mxfp4 mxfp8"}
# One architecture's cases; the architectures run side by side (one GPU holds them all).
one_arch() {
  local arch=$1 same=0 differ=0 refused=0
  local fp=$W/$arch-fp
  "$NEW" make-fixture --arch "$arch" --seed 7 --out "$fp" > /dev/null 2>&1 ||
    { echo "DIFFER make-fixture $arch failed"; echo "counts 0 1 0"; return; }
  for s in $schemes; do
    local q=$W/$arch-$s
    if ! "$NEW" quantize --in "$fp" --scheme "$s" --calib-synthetic 32 --dialect vllm --ignore-unsupported --out "$q" > "$q.quantize.log" 2>&1; then
      echo "skip   $arch $s (quantize refuses: $(tail -1 "$q.quantize.log"))"
      continue
    fi
    "$NEW" golden make --model "$q" --mode emulate --dialect vllm --synthetic 2 --seq-len 8 --out "$q.ref.h5" > /dev/null 2>&1
    for mode in free local; do
      extra=(--synthetic 2 --seq-len 8)
      [ "$mode" = local ] && extra=(--local "$q.ref.h5")
      "$OLD" engine run --model "$q" "${extra[@]}" --dump "$q.$mode.old.h5" > "$q.$mode.old.log" 2>&1
      ro=$?
      "$NEW" engine run --model "$q" "${extra[@]}" --dump "$q.$mode.new.h5" > "$q.$mode.new.log" 2>&1
      rn=$?
      if [ $ro -ne 0 ] && [ $rn -ne 0 ]; then
        if [ "$(tail -1 "$q.$mode.old.log")" = "$(tail -1 "$q.$mode.new.log")" ]; then
          echo "both refuse $arch $s $mode: $(tail -1 "$q.$mode.new.log")"
          refused=$((refused + 1))
        else
          echo "DIFFER $arch $s $mode: refusals differ: old '$(tail -1 "$q.$mode.old.log")' new '$(tail -1 "$q.$mode.new.log")'"
          differ=$((differ + 1))
        fi
        continue
      fi
      if [ $ro -ne 0 ] || [ $rn -ne 0 ]; then
        echo "DIFFER $arch $s $mode: old rc $ro '$(tail -1 "$q.$mode.old.log")', new rc $rn '$(tail -1 "$q.$mode.new.log")'"
        differ=$((differ + 1))
        continue
      fi
      if out=$(python3 "$here/dumps_identical.py" "$q.$mode.old.h5" "$q.$mode.new.h5" 2>&1); then
        echo "same   $arch $s $mode ($out)"
        same=$((same + 1))
      else
        echo "DIFFER $arch $s $mode: $out"
        differ=$((differ + 1))
      fi
      grep -h "on the device in" "$q.$mode.new.log" | head -1 | sed 's/^/         new: /'
    done
    rm -f "$q".*.h5
  done
  echo "counts $same $differ $refused"
}
for arch in $archs; do
  one_arch "$arch" > "$W/$arch.log" 2>&1 &
done
wait
same=0 differ=0 refused=0
for arch in $archs; do
  grep -v '^counts ' "$W/$arch.log"
  read -r _ s d r < <(grep '^counts ' "$W/$arch.log")
  same=$((same + ${s:-0})) differ=$((differ + ${d:-1})) refused=$((refused + ${r:-0}))
done
echo "loader parity: $same dumps bit-identical, $differ differ, $refused refused by both"
# Nothing compared is no evidence: that fails too.
[ $differ -eq 0 ] && [ $same -gt 0 ]
