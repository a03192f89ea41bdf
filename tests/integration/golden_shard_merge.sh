#!/usr/bin/env bash
# golden make --shard as a job array runs it: N processes at once, one shard each, then golden
# merge; the merged golden must be the unsharded run's file byte for byte (both under one
# SOURCE_DATE_EPOCH), for a bf16 and an activation-quantized checkpoint (its quant_stats summed).
#   golden_shard_merge.sh QPARITY MODEL_DIR
set -euo pipefail
qparity=$1 model=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export SOURCE_DATE_EPOCH=1764720000
"$qparity" quantize --in "$model" --scheme w8a8-int8-dyn --dialect vllm --out "$work/int8" >/dev/null 2>&1
for ckpt in "$model" "$work/int8"; do
  name=$(basename "$ckpt")
  args=(--model "$ckpt" --mode emulate --dialect vllm --synthetic 7 --seq-len 12)
  "$qparity" golden make "${args[@]}" --out "$work/$name-whole.h5" 2>/dev/null
  pids=()
  for i in 0 1 2; do
    "$qparity" golden make "${args[@]}" --shard "$i/3" --out "$work/$name-$i.h5" 2>/dev/null &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  "$qparity" golden merge --out "$work/$name-merged.h5" "$work/$name-2.h5" "$work/$name-0.h5" \
    "$work/$name-1.h5" 2>/dev/null
  cmp "$work/$name-whole.h5" "$work/$name-merged.h5"
  echo "golden_shard_merge: $name: 3 shards merged = the unsharded golden, byte for byte"
done
# Shards of different runs, a missing shard: refused, nothing written.
"$qparity" golden make --model "$model" --mode emulate --dialect vllm --synthetic 7 --seq-len 12 \
  --seed 2 --shard 1/3 \
  --out "$work/other-1.h5" 2>/dev/null
name=$(basename "$model")
for bad in "$work/$name-0.h5 $work/other-1.h5 $work/$name-2.h5" "$work/$name-0.h5 $work/$name-1.h5"; do
  # shellcheck disable=SC2086
  if "$qparity" golden merge --out "$work/bad.h5" $bad 2>"$work/err"; then
    echo "golden_shard_merge: merged $bad" >&2; exit 1
  fi
  [ ! -e "$work/bad.h5" ] || { echo "golden_shard_merge: wrote a refused merge" >&2; exit 1; }
  echo "golden_shard_merge: refused: $(cat "$work/err")"
done
