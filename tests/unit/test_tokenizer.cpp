// The checkpoint tokenizer (core/text/tokenizer.h) on small hand-made tokenizer.json files whose
// ids can be worked out by hand: GPT-2's byte alphabet, BPE merges by rank (not by position),
// ignore_merges, Llama 3's Split regex (contractions, digit triples, whitespace runs), the GPT-2
// regex of ByteLevel with add_prefix_space, added tokens, the BOS of TemplateProcessing and of
// tokenizer_config.json, non-ASCII bytes; refusals by name; and --text's windows. Against HF
// `tokenizers` itself on megabytes of text: tools/device/tokenizer_peer.py (device).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/text/tokenizer.h"
#include "error_of.h"
#include "golden/reference_run.h"
#include "scratch_dir.h"
#include "test_seed.h"

namespace qparity {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Llama 3's pre-tokenizer pattern, as its tokenizer.json carries it.
const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// GPT-2's bytes_to_unicode, written out here as the spec gives it.
std::string byte_char(int b) {
  int cp = b;
  if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))) {
    int n = 0;
    for (int x = 0; x < b; ++x)
      if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) ++n;
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

const std::string G = byte_char(' ');  // "Ġ"

// A tokenizer.json: ids 0..255 the byte characters (byte b is id b), then `extra` tokens from 256
// on, `merges` in rank order.
struct Spec {
  std::vector<std::string> extra;
  std::vector<std::pair<std::string, std::string>> merges;
  Json pre_tokenizer;
  Json normalizer;
  Json post_processor;
  Json added = Json::array();
  Json model_extra = Json::object();
  Json config;  // tokenizer_config.json, when not null
};

fs::path write_tokenizer(const std::string& name, const Spec& s) {
  const fs::path dir = test::scratch_dir("qparity_tokenizer") / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b)
    vocab[byte_char(b)] = b;
  for (size_t i = 0; i < s.extra.size(); ++i)
    vocab[s.extra[i]] = 256 + static_cast<int>(i);
  Json merges = Json::array();
  for (const auto& [a, b] : s.merges)
    merges.push_back(Json::array({a, b}));
  Json model = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", vocab},
                {"merges", merges}};
  for (const auto& [k, v] : s.model_extra.items())
    model[k] = v;
  const Json j = {{"version", "1.0"},
                  {"added_tokens", s.added},
                  {"normalizer", s.normalizer},
                  {"pre_tokenizer", s.pre_tokenizer},
                  {"post_processor", s.post_processor},
                  {"decoder", nullptr},
                  {"model", model}};
  std::ofstream(dir / "tokenizer.json") << j.dump();
  if (!s.config.is_null()) std::ofstream(dir / "tokenizer_config.json") << s.config.dump();
  return dir;
}

Json llama3_pre() {
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"},
             {"pattern", {{"Regex", kLlama3Pattern}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            {{"type", "ByteLevel"},
             {"add_prefix_space", false},
             {"trim_offsets", true},
             {"use_regex", false}}}}};
}

Json bos_template(const std::string& bos, int id) {
  return {{"type", "TemplateProcessing"},
          {"single",
           {{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
            {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
          {"pair", Json::array()},
          {"special_tokens", {{bos, {{"id", bos}, {"ids", {id}}, {"tokens", {bos}}}}}}};
}

TEST(Tokenizer, MergesApplyByRankNotPosition) {
  Spec s;
  // 256 he, 257 Ġt, 258 Ġthe, 259 the, 260 th
  s.extra = {"he", G + "t", G + "the", "the", "th"};
  // "h e" ranks before "t h": "the" becomes t + he, then the (rank 3), never th + e.
  s.merges = {{"h", "e"}, {G, "t"}, {G + "t", "he"}, {"t", "he"}, {"t", "h"}};
  s.pre_tokenizer = llama3_pre();
  const Tokenizer tok = Tokenizer::load(write_tokenizer("rank", s));
  EXPECT_THAT(tok.encode("the the"), ElementsAre(259, 258));
  // "tho": t h merges (rank 4; "h o" is no merge), o stays a byte.
  EXPECT_THAT(tok.encode("tho"), ElementsAre(260, 'o'));
}

TEST(Tokenizer, IgnoreMergesTakesWholeVocabularyWords) {
  Spec s;
  s.extra = {"xyz"};  // no merge builds it
  s.pre_tokenizer = llama3_pre();
  EXPECT_THAT(Tokenizer::load(write_tokenizer("merges", s)).encode("xyz"),
              ElementsAre('x', 'y', 'z'));
  s.model_extra = {{"ignore_merges", true}};
  EXPECT_THAT(Tokenizer::load(write_tokenizer("ignore", s)).encode("xyz"), ElementsAre(256));
}

TEST(Tokenizer, Llama3RegexSplitsContractionsDigitsAndWhitespaceRuns) {
  Spec s;
  s.pre_tokenizer = llama3_pre();
  // Every piece is a vocabulary word (ignore_merges), so the ids show the pieces.
  s.extra = {"I", "'M", G + "fine", "123", "45", G + G, G + "ok", "." + byte_char('\n')};
  s.model_extra = {{"ignore_merges", true}};
  const Tokenizer tok = Tokenizer::load(write_tokenizer("llama3", s));
  // (?i:'m) keeps "'M"; digits by threes; "   ok": two spaces, then " ok" (\s+(?!\S)); ".\n"
  // is punctuation with its newline.
  EXPECT_THAT(tok.encode("I'M fine12345   ok.\n"),
              ElementsAre(256, 257, 258, 259, 260, 261, 262, 263));
}

TEST(Tokenizer, ByteLevelRegexWithPrefixSpaceAndNonAsciiBytes) {
  Spec s;
  s.pre_tokenizer = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  s.extra = {G + "caf"};
  s.model_extra = {{"ignore_merges", true}};
  const Tokenizer tok = Tokenizer::load(write_tokenizer("bytelevel", s));
  // " café": " caf" is not a piece of its own (\p{L}+ takes é too), so the bytes of "Ġcafé":
  // ' ', c, a, f, 0xC3, 0xA9 (é in UTF-8), each its byte id.
  EXPECT_THAT(tok.encode("café"), ElementsAre(' ', 'c', 'a', 'f', 0xC3, 0xA9));
  EXPECT_THAT(tok.encode("caf"), ElementsAre(256));  // the prefix space joins the word
}

TEST(Tokenizer, AddedTokensSplitTheTextAndTemplatesAddBos) {
  Spec s;
  s.pre_tokenizer = llama3_pre();
  s.added = Json::array({{{"id", 300},
                          {"content", "<|bos|>"},
                          {"single_word", false},
                          {"lstrip", false},
                          {"rstrip", false},
                          {"normalized", false},
                          {"special", true}},
                         {{"id", 301},
                          {"content", "<|eot|>"},
                          {"single_word", false},
                          {"lstrip", false},
                          {"rstrip", false},
                          {"normalized", false},
                          {"special", true}}});
  s.post_processor = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"}, {"trim_offsets", false}}, bos_template("<|bos|>", 300)}}};
  const fs::path dir = write_tokenizer("added", s);
  const Tokenizer tok = Tokenizer::load(dir);
  EXPECT_THAT(tok.encode("a<|eot|>b"), ElementsAre(300, 'a', 301, 'b'));
  EXPECT_THAT(tok.encode("a<|eot|>b", false), ElementsAre('a', 301, 'b'));
  // tokenizer_config.json of a LlamaTokenizerFast rebuilds the template from its flags.
  s.config = {{"tokenizer_class", "LlamaTokenizerFast"},
              {"add_bos_token", false},
              {"add_eos_token", true},
              {"bos_token", "<|bos|>"},
              {"eos_token", {{"content", "<|eot|>"}}}};
  EXPECT_THAT(Tokenizer::load(write_tokenizer("config", s)).encode("a"), ElementsAre('a', 301));
  fs::remove_all(dir);
}

// The details where a simpler reading of HF would give other ids.
TEST(Tokenizer, FollowsHfOnEmptyMatchesPrefixSpacesWhiteSpaceAndRepeatedMerges) {
  const auto split_then_byte_level = [](const std::string& regex, bool prefix) {
    return Json{{"type", "Sequence"},
                {"pretokenizers",
                 {{{"type", "Split"},
                   {"pattern", {{"Regex", regex}}},
                   {"behavior", "Isolated"},
                   {"invert", false}},
                  {{"type", "ByteLevel"}, {"add_prefix_space", prefix}, {"use_regex", false}}}}};
  };
  Spec s;
  s.extra = {"ab"};
  s.merges = {{"a", "b"}};
  // An empty match splits: x* matches nothing before 'b', so "ab" is two pieces.
  s.pre_tokenizer = split_then_byte_level("x*", false);
  EXPECT_THAT(Tokenizer::load(write_tokenizer("empty", s)).encode("ab"), ElementsAre('a', 'b'));
  s.pre_tokenizer = split_then_byte_level("z", false);
  EXPECT_THAT(Tokenizer::load(write_tokenizer("nosplit", s)).encode("ab"), ElementsAre(256));
  // add_prefix_space: a space before every split (Llama 3's regex cuts "a", ",b"), not once
  // before the text.
  s.pre_tokenizer = split_then_byte_level(kLlama3Pattern, true);
  EXPECT_THAT(Tokenizer::load(write_tokenizer("prefix", s)).encode("a,b"),
              ElementsAre(' ', 'a', ' ', ',', 'b'));  // pieces "a", ",b": " a", " ,b"
  // \s is White_Space (Oniguruma), which U+180E is not: " \u180E" stays one piece of
  // ` ?[^\s\p{L}\p{N}]+`.
  Spec ws;
  ws.pre_tokenizer = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  ws.extra = {G + byte_char(0xE1) + byte_char(0xA0) + byte_char(0x8E)};
  ws.model_extra = {{"ignore_merges", true}};
  EXPECT_THAT(Tokenizer::load(write_tokenizer("ws", ws)).encode("a \xE1\xA0\x8E"),
              ElementsAre('a', 256));
  // A repeated merge keeps its last rank: "b c" (rank 1) then beats "a b" (rank 2).
  Spec dup;
  dup.pre_tokenizer = llama3_pre();
  dup.extra = {"ab", "bc"};
  dup.merges = {{"a", "b"}, {"b", "c"}, {"a", "b"}};
  EXPECT_THAT(Tokenizer::load(write_tokenizer("dup", dup)).encode("abc"), ElementsAre('a', 257));
  // A long run of one character is one pre-token; merges by rank, pair by pair, left to right.
  Spec run;
  run.pre_tokenizer = llama3_pre();
  run.extra = {"==", "===="};
  run.merges = {{"=", "="}, {"==", "=="}};
  const std::vector<int64_t> ids =
      Tokenizer::load(write_tokenizer("run", run)).encode(std::string(200001, '='));
  ASSERT_EQ(ids.size(), 50001u);
  EXPECT_EQ(ids.front(), 257);
  EXPECT_EQ(ids.back(), '=');
}

TEST(Tokenizer, RefusesWhatItCannotReproduceByName) {
  Spec s;
  s.pre_tokenizer = llama3_pre();
  const auto refusal = [&](const std::string& name, const Spec& spec) {
    return test::error_of([&] { Tokenizer::load(write_tokenizer(name, spec)); });
  };
  Spec fallback = s;
  fallback.model_extra = {{"byte_fallback", true}};
  EXPECT_THAT(refusal("fallback", fallback), HasSubstr("byte_fallback"));
  Spec meta = s;
  meta.pre_tokenizer = {{"type", "Metaspace"}, {"replacement", "_"}};
  EXPECT_THAT(refusal("metaspace", meta), HasSubstr("pre-tokenizer 'Metaspace'"));
  Spec nfkc = s;
  nfkc.normalizer = {{"type", "NFKC"}};
  EXPECT_THAT(refusal("nfkc", nfkc), HasSubstr("normalizer 'NFKC'"));
  Spec normalized = s;
  normalized.normalizer = {{"type", "NFC"}};
  normalized.added = Json::array({{{"id", 300}, {"content", "<x>"}, {"normalized", true}}});
  EXPECT_THAT(refusal("normalized", normalized), HasSubstr("matched after NFC"));
  Spec strip = s;
  strip.added = Json::array({{{"id", 300}, {"content", "<x>"}, {"lstrip", true}}});
  EXPECT_THAT(refusal("lstrip", strip), HasSubstr("with lstrip"));
  // Text: NFC composes e + U+0301 into U+00E9 (bytes C3 A9) before the byte alphabet; invalid
  // UTF-8 is refused by offset.
  Spec nfc = s;
  nfc.normalizer = {{"type", "NFC"}};
  const Tokenizer tok = Tokenizer::load(write_tokenizer("nfc", nfc));
  EXPECT_THAT(tok.encode("\xC3\xA9"), ElementsAre(0xC3, 0xA9));
  EXPECT_THAT(tok.encode("e\xCC\x81"), ElementsAre(0xC3, 0xA9));
  EXPECT_THAT(Tokenizer::load(write_tokenizer("plain", s)).encode("e\xCC\x81"),
              ElementsAre('e', 0xCC, 0x81));  // no normalizer: the bytes as they are
  EXPECT_THAT(test::error_of([&] { tok.encode("ab\xC3"); }),
              HasSubstr("invalid UTF-8 at byte offset 2"));
  EXPECT_THAT(test::error_of([&] { Tokenizer::load(fs::temp_directory_path() / "qparity_none"); }),
              HasSubstr("no tokenizer.json"));
}

// tokenizer.json files HF `tokenizers` refuses are refused here too, each naming the file and
// the key path; no raw library message (main: "[json.exception.out_of_range.403] key 'merges' not
// found", and a merge of tokens outside the vocabulary, a three-part merge, a fractional or a
// negative id accepted).
TEST(Tokenizer, RefusesWhatHfRefusesNamingTheKey) {
  Spec s;
  s.pre_tokenizer = llama3_pre();
  const auto refusal = [&](const std::string& name, const Spec& spec) {
    return test::error_of([&] { Tokenizer::load(write_tokenizer(name, spec)); });
  };
  Spec oov = s;
  oov.merges = {{"a", "b"}};  // "ab" is not in the vocabulary
  EXPECT_THAT(refusal("oov", oov),
              HasSubstr("tokenizer.json: key 'model.merges[0]': merge token 'ab' is not in "
                        "model.vocab"));
  const fs::path dir = write_tokenizer("edited", s);
  const auto edited = [&](const std::function<void(Json&)>& edit) {
    std::ifstream in(dir / "tokenizer.json");
    Json j = Json::parse(in);
    in.close();
    edit(j);
    std::ofstream(dir / "tokenizer.json") << j.dump();
    return test::error_of([&] { Tokenizer::load(dir); });
  };
  EXPECT_THAT(edited([](Json& j) { j["model"].erase("merges"); }),
              HasSubstr("key 'model': missing required key 'merges'"));
  EXPECT_THAT(edited([](Json& j) {
                j["model"]["vocab"]["ab"] = 300;
                j["model"]["merges"] = Json::array({"a b c"});
              }),
              HasSubstr("key 'model.merges[0]': merge 'a b c' is not 'left right' (two parts)"));
  EXPECT_THAT(edited([](Json& j) {
                j["model"]["merges"] = Json::array();
                j["model"]["vocab"]["x"] = 2.5;
              }),
              HasSubstr("key 'model.vocab.x': a token id is an integer, got 2.5"));
  EXPECT_THAT(edited([](Json& j) { j["model"]["vocab"]["x"] = -1; }),
              HasSubstr("key 'model.vocab.x': token id -1 is outside [0, 2^32)"));
  EXPECT_THAT(edited([](Json& j) {
                j["model"]["vocab"].erase("x");
                j["model"]["ignore_merges"] = "yes";
              }),
              HasSubstr("key 'model.ignore_merges'"));
  EXPECT_THAT(edited([](Json& j) {
                j["model"]["ignore_merges"] = false;
                j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = 3;
              }),
              HasSubstr("tokenizer.json: malformed tokenizer.json"));
}

TEST(Tokenizer, TextInputsAreWindowsOfTheStream) {
  Spec s;
  s.pre_tokenizer = llama3_pre();
  s.post_processor = bos_template("<|bos|>", 300);
  s.added = Json::array({{{"id", 300}, {"content", "<|bos|>"}, {"special", true}}});
  const fs::path dir = write_tokenizer("windows", s);
  const fs::path text = dir / "text.txt";
  std::ofstream(text) << "abcdefghij";  // 10 letters: one piece, no merges: 10 byte ids + BOS
  const golden::TokenInputs a = golden::tokenized_text_inputs(text, dir, 4, 0, 0);
  EXPECT_EQ(a.sequences, 2);  // [BOS a b c] [d e f g]; h i j dropped
  EXPECT_THAT(a.tokens, ElementsAre(300, 'a', 'b', 'c', 'd', 'e', 'f', 'g'));
  EXPECT_THAT(a.description, HasSubstr("3 tokens after the last window unused"));
  const golden::TokenInputs b = golden::tokenized_text_inputs(text, dir, 4, 3, 2);
  EXPECT_EQ(b.sequences, 2);  // stride 3, at most 2
  EXPECT_THAT(b.tokens, ElementsAre(300, 'a', 'b', 'c', 'c', 'd', 'e', 'f'));
  const golden::TokenInputs whole = golden::tokenized_text_inputs(text, dir, 0, 0, 0);
  EXPECT_EQ(whole.sequences, 1);
  EXPECT_EQ(whole.seq_len, 11);
  EXPECT_THAT(test::error_of([&] { golden::tokenized_text_inputs(text, dir, 64, 0, 0); }),
              HasSubstr("fewer than one sequence of 64"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace qparity
