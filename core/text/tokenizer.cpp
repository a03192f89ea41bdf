#include "core/text/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <queue>
#include <unordered_map>

#include "core/error.h"
#include "core/json_util.h"
#include "core/text/unicode_nfc.h"

namespace qparity {

namespace {

using Json = nlohmann::json;

// GPT-2's pre-tokenizer regex (ByteLevel with use_regex), as HF `tokenizers` writes it.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2's byte -> printable character map (bytes_to_unicode), each as UTF-8.
std::vector<std::string> byte_alphabet() {
  std::vector<int> cp(256, -1);
  for (int b = '!'; b <= '~'; ++b)
    cp[static_cast<size_t>(b)] = b;
  for (int b = 0xA1; b <= 0xAC; ++b)
    cp[static_cast<size_t>(b)] = b;
  for (int b = 0xAE; b <= 0xFF; ++b)
    cp[static_cast<size_t>(b)] = b;
  int next = 256;
  for (int b = 0; b < 256; ++b)
    if (cp[static_cast<size_t>(b)] < 0) cp[static_cast<size_t>(b)] = next++;
  std::vector<std::string> out(256);
  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(static_cast<char32_t>(cp[static_cast<size_t>(b)]), s);
    out[static_cast<size_t>(b)] = s;
  }
  return out;
}

// The byte offset of the first invalid UTF-8 sequence, or nullopt.
std::optional<size_t> invalid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    int len = 0;
    uint32_t cp = 0;
    if (b < 0x80) {
      len = 1, cp = b;
    } else if ((b & 0xE0) == 0xC0) {
      len = 2, cp = b & 0x1F;
    } else if ((b & 0xF0) == 0xE0) {
      len = 3, cp = b & 0x0F;
    } else if ((b & 0xF8) == 0xF0) {
      len = 4, cp = b & 0x07;
    } else {
      return i;
    }
    if (i + static_cast<size_t>(len) > s.size()) return i;
    for (int j = 1; j < len; ++j) {
      const auto c = static_cast<unsigned char>(s[i + static_cast<size_t>(j)]);
      if ((c & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (c & 0x3F);
    }
    const uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += static_cast<size_t>(len);
  }
  return std::nullopt;
}

// HF's regexes run on Oniguruma, whose \s is Unicode's White_Space property; PCRE2's \s in UCP
// mode also takes U+180E (MONGOLIAN VOWEL SEPARATOR, White_Space until Unicode 6.3). So \s and \S
// are rewritten to the White_Space list before compiling, inside and outside character classes.
constexpr const char* kWhiteSpace =
    R"(\x{9}-\x{D}\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

std::string onig_white_space(const std::string& pattern, const std::string& where) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (e == 'S') {
        if (in_class)
          throw Error(where,
                      "\\S inside a character class of the pre-tokenizer regex is not "
                      "supported");
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

class Regex {
 public:
  static constexpr uint32_t kMatchLimit = 1000000000;
  Regex(const std::string& onig_pattern, const std::string& where) {
    const std::string pattern = onig_white_space(onig_pattern, where);
    int err = 0;
    PCRE2_SIZE at = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &at, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw Error(where, "pre-tokenizer regex does not compile with PCRE2 at offset " +
                             std::to_string(at) + ": " + reinterpret_cast<const char*>(msg));
    }
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex() { pcre2_code_free(code_); }

  // Behavior Isolated: the matches and the non-empty gaps between them, in order.
  void split(std::string_view s, std::vector<std::string_view>& out) const {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    // Oniguruma (HF) has no step limit; PCRE2's default (10^7) stops on long runs the patterns'
    // backtracking \s+(?!\S) walks: allow 10^9 steps, and name the place when even that ends.
    pcre2_match_context* mc = pcre2_match_context_create(nullptr);
    pcre2_set_match_limit(mc, kMatchLimit);
    size_t at = 0, gap = 0;
    while (at <= s.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), at,
                                 PCRE2_NO_UTF_CHECK, md, mc);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        pcre2_match_data_free(md);
        pcre2_match_context_free(mc);
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        const size_t line = 1 + static_cast<size_t>(std::count(s.begin(), s.begin() + at, '\n'));
        throw Error("text",
                    "the pre-tokenizer regex stopped at byte " + std::to_string(at) + " (line " +
                        std::to_string(line) + " of the " + std::to_string(s.size()) +
                        "-byte run between added tokens): " + reinterpret_cast<const char*>(msg) +
                        (rc == PCRE2_ERROR_MATCHLIMIT
                             ? " (PCRE2's match limit of " + std::to_string(kMatchLimit) +
                                   " steps; a run that long without a split point: "
                                   "split the input there)"
                             : std::string()));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t b = ov[0], e = ov[1];
      if (e == b) {
        // An empty match still splits the text there (HF keeps it as a split point and drops
        // only the empty piece); the search goes on one code point further.
        if (b > gap) out.push_back(s.substr(gap, b - gap));
        gap = b;
        size_t n = b + 1;
        while (n < s.size() && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80)
          ++n;
        at = n;
        continue;
      }
      if (b > gap) out.push_back(s.substr(gap, b - gap));
      out.push_back(s.substr(b, e - b));
      gap = at = e;
    }
    if (gap < s.size()) out.push_back(s.substr(gap));
    pcre2_match_data_free(md);
    pcre2_match_context_free(mc);
  }

 private:
  pcre2_code* code_ = nullptr;
};

struct AddedToken {
  std::string content;
  int64_t id;
};

}  // namespace

struct Tokenizer::Impl {
  std::string description;
  std::unordered_map<std::string, int64_t> vocab;
  std::unordered_map<std::string, int> merge_rank;  // left + '\0' + right
  bool ignore_merges = false;
  bool nfc = false;
  std::unique_ptr<Regex> split;       // a Split pre-tokenizer's regex
  std::unique_ptr<Regex> byte_level;  // ByteLevel's own regex (use_regex)
  bool add_prefix_space = false;
  std::vector<AddedToken> added;  // longest content first
  std::vector<int64_t> prefix, suffix;
  std::vector<std::string> alphabet = byte_alphabet();
  std::string where;

  void bpe(const std::string& word, std::vector<int64_t>& ids) const;
  void encode_plain(std::string_view text, std::vector<int64_t>& ids,
                    std::unordered_map<std::string, std::vector<int64_t>>& cache) const;
};

void Tokenizer::Impl::bpe(const std::string& word, std::vector<int64_t>& ids) const {
  if (ignore_merges) {
    const auto it = vocab.find(word);
    if (it != vocab.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  // Symbols: the word's characters (each a byte's printable character, 1 or 2 UTF-8 bytes).
  std::vector<std::string> sym;
  for (size_t i = 0; i < word.size();) {
    size_t n = 1;
    while (i + n < word.size() && (static_cast<unsigned char>(word[i + n]) & 0xC0) == 0x80)
      ++n;
    sym.push_back(word.substr(i, n));
    i += n;
  }
  // Merges in order of rank, leftmost first among equal ranks, as HF's priority queue does: a
  // heap of (rank, position) over a linked list of symbols, stale entries skipped. O(n log n), so
  // a long run of one character (a single pre-token) stays cheap.
  const size_t n = sym.size();
  std::vector<ptrdiff_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (size_t i = 0; i < n; ++i)
    prev[i] = static_cast<ptrdiff_t>(i) - 1,
    next[i] = i + 1 < n ? static_cast<ptrdiff_t>(i + 1) : -1;
  const auto rank_of = [&](size_t a, size_t b) {
    const auto it = merge_rank.find(sym[a] + '\0' + sym[b]);
    return it == merge_rank.end() ? -1 : it->second;
  };
  using Entry = std::pair<int, size_t>;  // (rank, left position)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
  for (size_t i = 0; i + 1 < n; ++i)
    if (const int r = rank_of(i, i + 1); r >= 0) heap.push({r, i});
  while (!heap.empty()) {
    const auto [r, at] = heap.top();
    heap.pop();
    if (!alive[at] || next[at] < 0) continue;
    const auto right = static_cast<size_t>(next[at]);
    if (rank_of(at, right) != r) continue;  // the pair changed since this entry was pushed
    sym[at] += sym[right];
    alive[right] = false;
    next[at] = next[right];
    if (next[right] >= 0) prev[static_cast<size_t>(next[right])] = static_cast<ptrdiff_t>(at);
    if (prev[at] >= 0)
      if (const int pr = rank_of(static_cast<size_t>(prev[at]), at); pr >= 0)
        heap.push({pr, static_cast<size_t>(prev[at])});
    if (next[at] >= 0)
      if (const int nr = rank_of(at, static_cast<size_t>(next[at])); nr >= 0) heap.push({nr, at});
  }
  std::vector<std::string> merged;
  for (ptrdiff_t i = 0; i >= 0; i = next[static_cast<size_t>(i)])
    merged.push_back(std::move(sym[static_cast<size_t>(i)]));
  sym.swap(merged);
  for (const std::string& s : sym) {
    const auto it = vocab.find(s);
    if (it == vocab.end())
      throw Error(where, "BPE symbol '" + s + "' is not in the vocabulary (no unk_token handling)");
    ids.push_back(it->second);
  }
}

void Tokenizer::Impl::encode_plain(
    std::string_view text, std::vector<int64_t>& ids,
    std::unordered_map<std::string, std::vector<int64_t>>& cache) const {
  if (text.empty()) return;
  std::string normalized;
  if (nfc) {
    normalized = qparity::nfc(text);
    text = normalized;
  }
  std::vector<std::string_view> pieces, sub;
  if (split)
    split->split(text, pieces);
  else
    pieces.push_back(text);
  // ByteLevel's add_prefix_space: a space before every split that lacks one (HF applies it per
  // split of the pre-tokenized string, after the Split pre-tokenizer).
  std::vector<std::string> prefixed;
  if (add_prefix_space) {
    prefixed.reserve(pieces.size());  // (the views below point into it)
    for (std::string_view& p : pieces)
      if (p.front() != ' ') {
        prefixed.push_back(" " + std::string(p));
        p = prefixed.back();
      }
  }
  if (byte_level) {
    for (const std::string_view p : pieces)
      byte_level->split(p, sub);
    pieces.swap(sub);
  }
  for (const std::string_view p : pieces) {
    std::string word;
    for (const char c : p)
      word += alphabet[static_cast<unsigned char>(c)];
    auto it = cache.find(word);
    if (it == cache.end()) {
      std::vector<int64_t> w;
      bpe(word, w);
      it = cache.emplace(word, std::move(w)).first;
    }
    ids.insert(ids.end(), it->second.begin(), it->second.end());
  }
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
const std::string& Tokenizer::description() const {
  return impl_->description;
}
int64_t Tokenizer::vocab_size() const {
  return static_cast<int64_t>(impl_->vocab.size());
}

namespace {

std::string type_of(const Json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>()
                                                                      : "";
}

// A token id as HF reads it (u32): an integer in [0, 2^32), not 5.0, not -1.
int64_t token_id(const Json& v, const std::string& where) {
  if (!v.is_number_integer())
    throw Error(where,
                "a token id is an integer, got " + (v.is_number() ? v.dump() : json_type_name(v)));
  const int64_t id = as_int(v, where);
  if (id < 0 || id > int64_t{0xFFFFFFFF})
    throw Error(where, "token id " + std::to_string(id) + " is outside [0, 2^32)");
  return id;
}

}  // namespace

Tokenizer Tokenizer::load(const std::filesystem::path& dir) {
  // Any type mismatch the typed accessors above do not cover still names the file, never a raw
  // library message ("[json.exception.type_error.302] ...").
  try {
    return load_checked(dir);
  } catch (const Json::exception& e) {
    throw Error((dir / "tokenizer.json").string(),
                "malformed tokenizer.json (or tokenizer_config.json): " + json_error_text(e));
  }
}

Tokenizer Tokenizer::load_checked(const std::filesystem::path& dir) {
  auto impl = std::make_unique<Impl>();
  const std::filesystem::path file = dir / "tokenizer.json";
  const std::string w = file.string();
  impl->where = w;
  if (!std::filesystem::exists(file))
    throw Error(w,
                "no tokenizer.json in the checkpoint directory (--text needs the checkpoint's "
                "own tokenizer)");
  const Json j = read_json_file(file);  // regular file, duplicate keys refused
  require_object(j, w);
  // Model. Keys are named by their path in messages ("model.merges[3]"), as HF's own loader
  // refuses what it refuses.
  const auto at = [&](const std::string& path) { return key_where(w, path); };
  const Json& m = require_key(j, "model", w);
  require_object(m, at("model"));
  if (type_of(m) != "BPE")
    throw Error(
        w, "model type '" + type_of(m) + "': only byte-level BPE (Llama 3, Qwen) is supported");
  if (m.value("byte_fallback", false))
    throw Error(w, "BPE with byte_fallback (SentencePiece-style, Llama 2) is not supported");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(k) && !m[k].is_null() && !m[k].get<std::string>().empty())
      throw Error(w, std::string("BPE with ") + k + " is not supported");
  if (m.contains("dropout") && !m["dropout"].is_null())
    throw Error(w, "BPE dropout is not deterministic; not supported");
  impl->ignore_merges = m.contains("ignore_merges") && !m["ignore_merges"].is_null() &&
                        as_bool(m["ignore_merges"], at("model.ignore_merges"));
  const Json& vocab = require_key(m, "vocab", at("model"));
  require_object(vocab, at("model.vocab"));
  for (const auto& [tok, id] : vocab.items())
    impl->vocab.emplace(tok, token_id(id, at("model.vocab." + tok)));
  const Json& merges = require_key(m, "merges", at("model"));
  if (!merges.is_array())
    throw Error(at("model.merges"), "expected an array, got " + json_type_name(merges));
  int rank = 0;
  for (size_t i = 0; i < merges.size(); ++i) {
    const Json& mg = merges[i];
    const std::string mw = at("model.merges[" + std::to_string(i) + "]");
    std::string a, b;
    if (mg.is_string()) {
      // HF: "left right", exactly two parts.
      const std::string s = mg.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        throw Error(mw, "merge '" + s + "' is not 'left right' (two parts)");
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string()) {
      a = mg[0].get<std::string>(), b = mg[1].get<std::string>();
    } else {
      throw Error(mw, "a merge is \"left right\" or [left, right], got " + mg.dump());
    }
    // HF refuses a merge whose parts or result are not in the vocabulary.
    for (const std::string& t : {a, b, a + b})
      if (!impl->vocab.count(t)) throw Error(mw, "merge token '" + t + "' is not in model.vocab");
    impl->merge_rank[a + '\0' + b] = rank++;  // a repeated pair: the last rank, as HF's map
  }
  // Normalizer.
  const Json& norm = j.contains("normalizer") ? j["normalizer"] : Json();
  std::string norm_text = "none";
  const auto take_normalizer = [&](const Json& n) {
    if (type_of(n) == "NFC")
      impl->nfc = true, norm_text = "NFC";
    else
      throw Error(w, "normalizer '" + type_of(n) + "' is not supported (none or NFC)");
  };
  if (type_of(norm) == "Sequence") {
    for (const Json& n : norm.at("normalizers"))
      take_normalizer(n);
  } else if (!norm.is_null()) {
    take_normalizer(norm);
  }
  // Pre-tokenizer.
  const Json& pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : Json();
  std::vector<Json> pres;
  if (type_of(pre) == "Sequence")
    for (const Json& p : pre.at("pretokenizers"))
      pres.push_back(p);
  else if (!pre.is_null())
    pres.push_back(pre);
  bool byte_level = false;
  for (const Json& p : pres) {
    const std::string t = type_of(p);
    if (t == "Split" && !impl->split && !byte_level) {
      if (p.value("behavior", "") != "Isolated" || p.value("invert", false))
        throw Error(w, "Split pre-tokenizer with behavior '" + p.value("behavior", "") +
                           "' / invert: only Isolated, not inverted, is supported");
      const Json& pat = p.at("pattern");
      if (!pat.contains("Regex"))
        throw Error(w, "Split pre-tokenizer with a String pattern is not supported");
      impl->split = std::make_unique<Regex>(pat["Regex"].get<std::string>(), w);
    } else if (t == "ByteLevel" && !byte_level) {
      byte_level = true;
      impl->add_prefix_space = p.value("add_prefix_space", false);
      if (p.value("use_regex", true)) impl->byte_level = std::make_unique<Regex>(kGpt2Pattern, w);
    } else {
      throw Error(w, "pre-tokenizer '" + t +
                         "' (or this order) is not supported: Split (Isolated) then ByteLevel");
    }
  }
  if (!byte_level) throw Error(w, "no ByteLevel pre-tokenizer: only byte-level BPE is supported");
  // Added tokens.
  for (const Json& a : j.value("added_tokens", Json::array())) {
    for (const char* k : {"lstrip", "rstrip", "single_word"})
      if (a.value(k, false))
        throw Error(w,
                    "added token '" + a.value("content", "") + "' with " + k + " is not supported");
    // HF matches normalized added tokens in the normalized text, after the others; with a
    // normalizer that order is not reproduced here.
    if (impl->nfc && a.value("normalized", !a.value("special", false)))
      throw Error(w, "added token '" + a.value("content", "") +
                         "' is normalized (matched after NFC): not supported with a normalizer");
    impl->added.push_back(
        {as_string(require_key(a, "content", at("added_tokens[]")), at("added_tokens[].content")),
         token_id(require_key(a, "id", at("added_tokens[]")), at("added_tokens[].id"))});
  }
  std::stable_sort(
      impl->added.begin(), impl->added.end(),
      [](const AddedToken& x, const AddedToken& y) { return x.content.size() > y.content.size(); });
  const auto id_of = [&](const std::string& content) -> int64_t {
    for (const AddedToken& a : impl->added)
      if (a.content == content) return a.id;
    const auto it = impl->vocab.find(content);
    if (it == impl->vocab.end()) throw Error(w, "special token '" + content + "' has no id");
    return it->second;
  };
  // Post-processor.
  std::vector<Json> posts;
  const Json& post = j.contains("post_processor") ? j["post_processor"] : Json();
  if (type_of(post) == "Sequence")
    for (const Json& p : post.at("processors"))
      posts.push_back(p);
  else if (!post.is_null())
    posts.push_back(post);
  for (const Json& p : posts) {
    const std::string t = type_of(p);
    if (t == "ByteLevel") continue;  // offsets only
    if (t != "TemplateProcessing")
      throw Error(w, "post-processor '" + t + "' is not supported (TemplateProcessing, ByteLevel)");
    bool seen_a = false;
    const std::string pw = at("post_processor");
    const Json& single = require_key(p, "single", pw);
    if (!single.is_array())
      throw Error(pw + ".single", "expected an array, got " + json_type_name(single));
    for (const Json& item : single) {
      require_object(item, pw + ".single[]");
      if (item.contains("Sequence")) {
        seen_a = true;
      } else {
        const std::string name =
            as_string(require_key(require_key(item, "SpecialToken", pw + ".single[]"), "id",
                                  pw + ".single[].SpecialToken"),
                      pw + ".single[].SpecialToken.id");
        const Json& ids = require_key(
            require_key(require_key(p, "special_tokens", pw), name, pw + ".special_tokens"), "ids",
            pw + ".special_tokens." + name);
        if (!ids.is_array())
          throw Error(pw + ".special_tokens." + name + ".ids", "expected an array");
        for (const Json& id : ids)
          (seen_a ? impl->suffix : impl->prefix)
              .push_back(token_id(id, pw + ".special_tokens." + name + ".ids[]"));
      }
    }
  }
  // tokenizer_config.json: LlamaTokenizer(Fast) rebuilds the template from its flags.
  const std::filesystem::path cfg_file = dir / "tokenizer_config.json";
  if (std::filesystem::exists(cfg_file)) {
    const Json c = read_json_file(cfg_file);
    const std::string cls = c.value("tokenizer_class", "");
    if (cls == "LlamaTokenizerFast" || cls == "LlamaTokenizer") {
      const auto token = [&](const char* key) -> std::optional<std::string> {
        if (!c.contains(key) || c[key].is_null()) return std::nullopt;
        return c[key].is_string() ? c[key].get<std::string>()
                                  : c[key].at("content").get<std::string>();
      };
      impl->prefix.clear(), impl->suffix.clear();
      if (c.value("add_bos_token", true) && token("bos_token"))
        impl->prefix.push_back(id_of(*token("bos_token")));
      if (c.value("add_eos_token", false) && token("eos_token"))
        impl->suffix.push_back(id_of(*token("eos_token")));
    }
  }
  impl->description =
      "byte-level BPE, " + std::to_string(impl->vocab.size()) + " entries + " +
      std::to_string(impl->added.size()) + " added, " + std::to_string(impl->merge_rank.size()) +
      " merges, normalizer " + norm_text + (impl->split ? ", Split regex" : "") +
      (impl->byte_level ? ", GPT-2 regex" : "") + (impl->ignore_merges ? ", ignore_merges" : "") +
      ", " + std::to_string(impl->prefix.size()) + " special token(s) before and " +
      std::to_string(impl->suffix.size()) + " after";
  return Tokenizer(std::move(impl));
}

std::vector<int64_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& t = *impl_;
  if (const auto bad = invalid_utf8(text))
    throw Error("--text", "invalid UTF-8 at byte offset " + std::to_string(*bad));
  std::vector<int64_t> ids;
  if (add_special_tokens) ids = t.prefix;
  std::unordered_map<std::string, std::vector<int64_t>> cache;
  // Added tokens split the text first (leftmost; the longest content at a position wins).
  size_t plain = 0;
  for (size_t i = 0; i < text.size();) {
    const AddedToken* hit = nullptr;
    for (const AddedToken& a : t.added)
      if (!a.content.empty() && a.content[0] == text[i] &&
          text.compare(i, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    if (!hit) {
      ++i;
      continue;
    }
    t.encode_plain(text.substr(plain, i - plain), ids, cache);
    ids.push_back(hit->id);
    i += hit->content.size();
    plain = i;
  }
  t.encode_plain(text.substr(plain), ids, cache);
  if (add_special_tokens) ids.insert(ids.end(), t.suffix.begin(), t.suffix.end());
  return ids;
}

}  // namespace qparity
