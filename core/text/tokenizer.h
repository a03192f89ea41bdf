#pragma once
// A checkpoint's own tokenizer, for `--text FILE`: the byte-level BPE of Hugging Face
// `tokenizers` as Llama 3 and Qwen2 / Qwen3 checkpoints ship it in tokenizer.json, reproduced id
// for id (checked on the device against `tokenizers` itself, tools/device/tokenizer_peer.py).
//
// What runs, in HF's order:
//   1. added tokens: each occurrence of an added token's content in the text (leftmost, longest
//      first) is that token's id, and the text between them goes through 2-5 piece by piece;
//   2. normalizer: none, or NFC (unicode_nfc.h) on each piece between added tokens;
//   3. pre-tokenizer: the Split regex (behavior Isolated: matches and the gaps between them are
//      pieces) and / or ByteLevel (its own GPT-2 regex when use_regex, add_prefix_space), run
//      with PCRE2 in UTF + UCP mode (\p{L}, \p{N}, \s as Unicode classes);
//   4. each piece's bytes mapped to GPT-2's printable byte alphabet, then BPE: with ignore_merges
//      a piece that is a vocabulary entry is that id; else the lowest-ranked adjacent pair is
//      merged (leftmost among equals) until no pair is in the merges;
//   5. post-processor: TemplateProcessing's special tokens around the single sequence (Llama 3's
//      <|begin_of_text|>), ByteLevel (nothing for ids), or none. tokenizer_config.json's
//      add_bos_token / add_eos_token replace them for tokenizer_class LlamaTokenizer(Fast), which
//      rebuilds the template from those flags in transformers.
// Anything else (another model type, byte_fallback, a normalizer or pre-tokenizer not listed,
// added tokens with lstrip / rstrip / single_word) is refused by name when the tokenizer loads.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace qparity {

class Tokenizer {
 public:
  // Reads dir/tokenizer.json (and dir/tokenizer_config.json when present).
  static Tokenizer load(const std::filesystem::path& dir);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // The ids of `text` (UTF-8; invalid UTF-8 is an Error naming the byte offset), with the
  // post-processor's special tokens when add_special_tokens.
  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // One line: model type, normalizer, pre-tokenizer, specials added, vocabulary size.
  const std::string& description() const;
  int64_t vocab_size() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  static Tokenizer load_checked(const std::filesystem::path& dir);
  std::unique_ptr<Impl> impl_;
};

}  // namespace qparity
