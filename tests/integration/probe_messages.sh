#!/usr/bin/env bash
# The second hostile probe's inputs that had no test of their own (issue 50): each must end at
# once with its exit status and one line naming the file, key or rule; none may hang (every call
# runs under a 20 s timeout, so a hang fails instead of blocking CI).
#   probe_messages.sh QPARITY MODEL_DIR [PYTHON]
set -uo pipefail
qparity=$(realpath "$1") model=$(realpath "$2") python=${3:-}
source_dir=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
# expect STATUS SUBSTRING CMD...: the exit status and a substring of stderr+stdout.
expect() {
  local want=$1 text=$2
  shift 2
  local out rc
  out=$(timeout 20 "$@" 2>&1)
  rc=$?
  if [ "$rc" -ne "$want" ] || [[ "$out" != *"$text"* ]]; then
    echo "FAIL: $* -> exit $rc (want $want), expected '$text' in: ${out:0:400}"
    failures=$((failures + 1))
  else
    echo "ok: $* -> exit $rc: ${out:0:160}"
  fi
}
cd "$work"
mkfifo fifo.txt
for i in 1 2 3 4 5 6 7 8 9 10; do
  echo "In the beginning God created the heaven and the earth."
done > short.txt  # more than one sequence of 64 tokens, fewer than 8
# Hangs: every text, token and tokenizer path is checked before it is opened.
expect 1 "is not a regular file" "$qparity" golden make --model "$model" --text fifo.txt --seq-len 8 --out g.h5
expect 1 "is not a regular file" "$qparity" trace --model "$model" --text fifo.txt --out t.safetensors
expect 1 "is not a regular file" "$qparity" golden make --model "$model" --tokens fifo.txt --seq-len 8 --out g.h5
cp -r "$model" fifo-model && rm fifo-model/tokenizer.json && mkfifo fifo-model/tokenizer.json
expect 1 "is not a regular file" "$qparity" tokenize --model fifo-model --text short.txt
# Declared sizes are bounded with a named error, not std::bad_alloc.
expect 2 "beyond a fixture's" "$qparity" make-fixture --arch llama --hidden 1048576 --seed 1 --out fx
# Out of memory below those bounds: one line saying so, never a bare std::bad_alloc (an
# address-space limit makes the allocation fail at once).
expect 1 "error: out of memory: the run needs more memory" bash -c "ulimit -v 1000000; exec \
  '$qparity' make-fixture --arch llama --size small --hidden 16384 --seed 1 --out oom-fixture"
# A free run's points outside the gates are shown as not judged (it is judged end to end): the
# reference with silu(gate) rounded before the product, a legitimate engine's choice.
timeout 60 "$qparity" judge-matrix --model "$source_dir/fixtures/trained/llama" \
  --candidates silu-rounded --sequences 2 --seq-len 16 --out jm > /dev/null 2>&1
expect 0 "<- first outside the point gates (not judged in a free run)" \
  "$qparity" compare jm/work/llama.golden.h5 jm/work/llama.silu-rounded.free.h5
# A policy bound below zero is refused by key.
sed 's/"max_dln_ppl_upper": [0-9.eE+-]*/"max_dln_ppl_upper": -1/' \
  "$(dirname "$qparity")/policies/bf16.json" > negative.json
grep -q '"max_dln_ppl_upper": -1' negative.json || { echo "FAIL: could not plant the bound"; exit 1; }
"$qparity" golden make --model "$model" --synthetic 2 --seq-len 16 --out g.h5 2>/dev/null
expect 1 "max_dln_ppl_upper" "$qparity" compare g.h5 g.h5 --policy negative.json
# A policy of another scheme is said, not applied silently.
expect 0 "is derived for scheme 'fp8-block', the candidate ran 'bf16'" \
  "$qparity" compare g.h5 g.h5 --policy "$(dirname "$qparity")/policies/fp8-block.json"
# validate: fewer tokens than asked, --schemes beside --candidate.
expect 1 "fewer than the 8 sequences asked" "$qparity" validate --model "$model" --schemes w8a16-ch \
  --text short.txt --sequences 8 --seq-len 64 --out rep --no-engine
expect 2 "--schemes does not apply" "$qparity" validate --model "$model" --candidate g.h5 \
  --schemes w8a16-ch --out rep2
# A quantization that would quantize nothing is an error, not a plain copy.
"$qparity" make-fixture --arch llama --hidden 64 --intermediate 172 --seed 1 --out fx64 >/dev/null 2>&1
expect 1 "needs K = 64 divisible by 128" "$qparity" quantize --in fx64 --scheme fp8-block \
  --dialect compressed-tensors --out fq
[ ! -e fq ] || { echo "FAIL: a refused quantize left fq/"; failures=$((failures + 1)); }
# The Python dump helper: one line, no traceback, without transformers.
if [ -n "$python" ] && ! "$python" -c "import transformers" 2>/dev/null; then
  expect 1 "needs torch and transformers" env PYTHONPATH="$source_dir/python" \
    "$python" -m qparity_dump hf --model "$model" --tokens g.h5 --out c.h5
fi
echo "probe_messages: $failures failure(s)"
[ "$failures" -eq 0 ]
