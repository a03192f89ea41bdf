#!/usr/bin/env bash
# A pre-tokenizer regex that backtracks past PCRE2's match limit (10^9 steps; Oniguruma, HF's
# engine, has none) ends with one line naming the run, the byte and the line, the limit, and what
# to do, never the bare "PCRE2 match error -47" (issue 50). The catastrophic pattern (a+)+b on 40
# a's reaches the limit in about 10 s of one core.
#   tokenizer_match_limit.sh QPARITY MODEL_DIR
set -uo pipefail
qparity=$(realpath "$1") model=$(realpath "$2")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$model" "$work/model"
python3 - "$work/model/tokenizer.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
t["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "(a+)+b|\\s+|."}, "behavior": "Isolated",
     "invert": False},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
json.dump(t, open(sys.argv[1], "w"))
PY
printf 'one line\n%s' "$(printf 'a%.0s' $(seq 40))c" > "$work/text.txt"
out=$(timeout 120 "$qparity" tokenize --model "$work/model" --text "$work/text.txt" 2>&1)
rc=$?
want="the pre-tokenizer regex stopped at byte 9 (line 2 of the 50-byte run between added tokens)"
if [ $rc -ne 1 ] || [[ "$out" != *"$want"* ]] || [[ "$out" != *"match limit of 1000000000 steps"* ]]; then
  echo "FAIL: exit $rc, expected '$want' and the limit in: $out"
  exit 1
fi
echo "ok: $out"
