#!/usr/bin/env python3
"""qparity's tokenizer (core/text/tokenizer.h, `qparity tokenize`) against Hugging Face `tokenizers`.

Usage (on the device, where `tokenizers` is installed):
  python3 tools/device/tokenizer_peer.py QPARITY CORPUS.txt OUTDIR

Trains three byte-level BPE tokenizers with `tokenizers` on the first half of CORPUS (no network:
the trainer makes the vocabulary and merges), in the shapes real checkpoints ship:
  llama3  Split(Llama 3's regex, Isolated) + ByteLevel(use_regex=False), ignore_merges, a
          TemplateProcessing BOS (<|begin_of_text|>), added special tokens;
  qwen2   NFC + Split(Qwen2's regex: single digits) + ByteLevel(use_regex=False), no BOS;
  gpt2    ByteLevel(add_prefix_space=True, use_regex=True);
then encodes two texts with both implementations and compares the ids: the whole corpus (several
MB of English with some non-ASCII names) and a generated stress text (whitespace runs of spaces,
tabs, CR/LF, NBSP, ideographic space, U+2028; contractions in every case; digit runs; accented
Latin, decomposed accents (e + U+0301, which NFC composes), Hangul jamo, Greek, Cyrillic, CJK,
emoji, added tokens in the middle of words, U+180E next to spaces, characters assigned after
Unicode 9.0 that NFC would change under newer tables, a 3,000-character run of '=').
Prints one line per (tokenizer, text): ids compared, identical or the first difference.
"""
import os
import random
import subprocess
import sys

from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
          r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
         r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]


def build(kind, train_text):
    tok = Tokenizer(models.BPE(ignore_merges=(kind == "llama3")))
    if kind == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3 if kind == "llama3" else QWEN2), behavior="isolated",
                                 invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if kind == "qwen2":
        tok.normalizer = normalizers.NFC()
    trainer = trainers.BpeTrainer(vocab_size=6000, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([train_text[i:i + 4096] for i in range(0, len(train_text), 4096)],
                            trainer)
    if kind == "llama3":
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                          special_tokens=[("<|begin_of_text|>", bos)])])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def stress_text(n, seed=5):
    rng = random.Random(seed)
    words = ["the", "The", "THE", "don't", "DON'T", "we're", "I'M", "you'll", "she'd", "it's",
             "café", "naïve", "Ærø", "straße", "Ελληνικά", "русский", "中文字符", "日本語のテキスト",
             "한국어", "🙂", "👩‍💻", "1234567", "3.14159", "x86_64", "e-mail", "co-op", "<|eot_id|>",
             "a<|end_of_text|>b", "!!!", "...", "\u00a0", "\u3000", "\u2028", "tab\tsep",
             "ſ", "ﬁ", "Ω", "İ", "ǅ", "e\u0301", "cafe\u0301s", "A\u030a", "\u1100\u1161\u11a8",
             "q\u0323\u0307", "\u0958", "\u2126", "a \u180eb", "\U00011935\U00011930",
             "a\u0898\u0316", "=" * 3000]
    spaces = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000 ", "    \n"]
    return "".join(rng.choice(words) + rng.choice(spaces) for _ in range(n))


def qparity_ids(qparity, model_dir, text_file):
    out = os.path.join(model_dir, "ids.txt")
    r = subprocess.run([qparity, "tokenize", "--model", model_dir, "--text", text_file, "--out",
                        out, "--force"], capture_output=True, text=True)
    if r.returncode != 0:
        return None, r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "exit %d" % r.returncode
    return [int(x) for x in open(out).read().split()], r.stderr.strip()


def main():
    qparity, corpus, outdir = sys.argv[1:4]
    text = open(corpus, encoding="utf-8").read()
    train = text[: len(text) // 2]
    texts = {"corpus": text, "stress": stress_text(40000)}
    bad = 0
    for kind in ["llama3", "qwen2", "gpt2"]:
        d = os.path.join(outdir, kind)
        os.makedirs(d, exist_ok=True)
        tok = build(kind, train)
        tok.save(os.path.join(d, "tokenizer.json"))
        for name, t in texts.items():
            f = os.path.join(d, name + ".txt")
            open(f, "w", encoding="utf-8").write(t)
            ref = tok.encode(t).ids
            ids, msg = qparity_ids(qparity, d, f)
            if ids is None:
                print(f"{kind} {name}: qparity failed: {msg}")
                bad += 1
                continue
            same = ids == ref
            line = (f"{kind} {name}: {len(t.encode())} bytes, {len(ref)} ids from tokenizers, "
                    f"{len(ids)} from qparity: {'identical' if same else 'DIFFERENT'}")
            if not same:
                bad += 1
                i = next((i for i, (a, b) in enumerate(zip(ids, ref)) if a != b),
                         min(len(ids), len(ref)))
                line += (f"; first difference at id {i}: qparity {ids[i:i + 5]} vs "
                         f"tokenizers {ref[i:i + 5]} ({[tok.id_to_token(x) for x in ref[i:i + 5]]})")
            print(line)
    print("tokenizer peer:", "all identical" if bad == 0 else f"{bad} FAILED")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
