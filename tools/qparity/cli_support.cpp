#include "tools/qparity/cli_support.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <stdexcept>

#include "core/error.h"
#include "core/memory_budget.h"
#include "schemes/description/dialect.h"

namespace qparity::cli {

namespace fs = std::filesystem;

fs::path installed_data_dir(const fs::path& name) {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  for (const fs::path& dir :
       {exe.parent_path() / ".." / "share" / "qparity" / name, exe.parent_path() / name})
    if (fs::is_directory(dir, ec)) return dir.lexically_normal();
  return {};
}

fs::path policy_dir(const std::string& option) {
  if (!option.empty()) {
    if (!fs::is_directory(option))
      throw Error("--policies " + option, "is not a directory of policies (<scheme>.json)");
    return option;
  }
  const fs::path dir = installed_policy_dir();
  if (dir.empty())
    throw Error("policies",
                "none installed beside this binary (looked in <bin>/../share/qparity/policies and "
                "<bin>/policies); give --policies DIR");
  return dir;
}

CLI::IsMember dialect_choices() {
  std::vector<std::string> names;
  for (const auto d : kAllDialects)
    names.emplace_back(qparity::to_string(d));
  return CLI::IsMember(names);
}

CLI::IsMember mode_choices() {
  return CLI::IsMember(std::vector<std::string>{"exact", "emulate"});
}

CLI::Validator seed_check() {
  return CLI::Validator(
      [](std::string& v) {
        const bool digits = !v.empty() && std::all_of(v.begin(), v.end(), [](unsigned char c) {
          return std::isdigit(c);
        });
        return digits ? std::string() : "a seed is a non-negative integer, got '" + v + "'";
      },
      "SEED");
}

CLI::IsMember role_choices() {
  return CLI::IsMember(std::vector<std::string>{"engine", "format"});
}

golden::PolicyRole parse_role(const std::string& role) {
  if (role == "engine") return golden::PolicyRole::kEngine;
  if (role == "format") return golden::PolicyRole::kFormat;
  throw UsageError("--role", "'" + role + "' is not a role (engine or format)");
}

golden::PolicyRole implied_role(const golden::GoldenMeta& g, const golden::GoldenMeta& c) {
  return g.scheme == "bf16" && c.scheme != "bf16" && c.producer == "qparity-reference"
             ? golden::PolicyRole::kFormat
             : golden::PolicyRole::kEngine;
}

ChosenPolicy choose_policy(const std::string& policy_option, const std::string& role_option,
                           const golden::GoldenMeta& g, const golden::GoldenMeta& c) {
  ChosenPolicy out;
  out.role = role_option.empty() ? implied_role(g, c) : parse_role(role_option);
  const char* role = out.role == golden::PolicyRole::kFormat ? "format" : "engine";
  const std::string why_role =
      role_option.empty()
          ? std::string(", role ") + role + " implied by the golden's scheme '" + g.scheme +
                "' and the candidate's '" + c.scheme + "' (" + c.producer + ")"
          : std::string(", role ") + role + " (--role)";
  if (!policy_option.empty()) {
    out.policy = golden::load_policy(policy_option);
    out.source = "--policy" + why_role;
    return out;
  }
  const fs::path dir = installed_policy_dir();
  const fs::path file = dir / (c.scheme + ".json");
  if (dir.empty()) {
    out.source = "no --policy, and no policies installed beside this binary";
  } else if (c.scheme.find_first_of("/\\") != std::string::npos || !fs::is_regular_file(file)) {
    out.source = "no --policy, and no installed policy for the candidate's scheme '" + c.scheme +
                 "' in " + dir.string();
  } else {
    out.policy = golden::load_policy(file);
    out.source = "implied by the candidate's scheme '" + c.scheme + "'" + why_role;
  }
  return out;
}

golden::EndToEndGate parse_budget(const std::string& text) {
  golden::EndToEndGate g;
  g.why = "--budget " + text;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    start = comma + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    double v = 0;
    try {
      size_t used = 0;
      v = std::stod(item.substr(eq == std::string::npos ? item.size() : eq + 1), &used);
      if (used != item.size() - eq - 1) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw UsageError("--budget", "'" + item + "' is not KEY=NUMBER (kld, top1, dln_ppl)");
    }
    if (!std::isfinite(v)) throw UsageError("--budget", "'" + item + "' is not finite");
    if (key == "kld" && v >= 0)
      g.max_kld_upper = v;
    else if (key == "top1" && v >= 0 && v <= 1)
      g.min_top1_lower = v;
    else if (key == "dln_ppl" && v >= 0)
      g.max_dln_ppl_upper = v;
    else
      throw UsageError("--budget", "'" + item +
                                       "': keys are kld (>= 0), top1 (in [0, 1]) and dln_ppl "
                                       "(>= 0)");
  }
  if (!g.max_kld_upper && !g.min_top1_lower && !g.max_dln_ppl_upper)
    throw UsageError("--budget", "gives no bound (kld=, top1=, dln_ppl=)");
  return g;
}

std::optional<golden::EndToEndGate> budget_for(const std::string& text, bool given,
                                               golden::PolicyRole role) {
  if (!given) return std::nullopt;
  if (text.empty()) throw UsageError("--budget", "is empty: give kld=X,top1=Y,dln_ppl=Z");
  if (role == golden::PolicyRole::kEngine)
    throw UsageError("--budget",
                     "sets the format role's end-to-end budget, but this comparison is judged "
                     "in the engine role (an engine's policy gates it; use --role format to judge "
                     "the format)");
  return parse_budget(text);
}

golden::TokenInputs token_inputs(const std::string& command, const std::string& tokens_file,
                                 const std::string& token_ids, int64_t synthetic, int64_t seq_len,
                                 int64_t vocab, uint64_t seed, const TextInput& text) {
  const int given =
      !tokens_file.empty() + !token_ids.empty() + !text.file.empty() + (synthetic > 0);
  if (given != 1)
    throw UsageError(command,
                     "give exactly one of --tokens FILE ('-' for stdin), --token-ids 1,2,3, "
                     "--text FILE or --synthetic N");
  if (text.stride != 0 && text.file.empty())
    throw UsageError(command, "--stride applies to --text only");
  golden::TokenInputs in;
  if (!text.file.empty()) {
    in = golden::tokenized_text_inputs(text.file, text.model, seq_len, text.stride, 0);
  } else if (synthetic > 0) {
    if (seq_len <= 0)
      throw UsageError(command, "--synthetic N needs --seq-len T (tokens per sequence)");
    in = golden::synthetic_inputs(synthetic, seq_len, vocab, seed);
  } else if (!token_ids.empty()) {
    in = golden::text_inputs(token_ids, seq_len, "--token-ids", "ids:" + token_ids.substr(0, 32));
  } else {
    in = golden::file_inputs(tokens_file, seq_len);
  }
  for (const int64_t t : in.tokens)
    if (t >= vocab)
      throw Error(!text.file.empty()    ? text.file + " (tokenized)"
                  : tokens_file.empty() ? "--token-ids"
                                        : tokens_file,
                  "token id " + std::to_string(t) + " is outside the model's vocabulary of " +
                      std::to_string(vocab));
  return in;
}

void add_token_options(CLI::App* cmd, std::string& tokens_file, std::string& token_ids,
                       TextInput& text) {
  cmd->add_option("--tokens", tokens_file,
                  "file of token ids, whitespace or comma separated ('-': standard input)");
  cmd->add_option("--token-ids", token_ids, "a literal list of token ids: 1,2,3");
  cmd->add_option("--text", text.file,
                  "UTF-8 text ('-': standard input), tokenized by the checkpoint's tokenizer.json "
                  "(byte-level BPE: Llama 3, Qwen) and cut into sequences of --seq-len");
  cmd->add_option("--stride", text.stride,
                  "--text: a sequence starts every this many tokens (default --seq-len: no "
                  "overlap; the tail shorter than a sequence is dropped)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
}

void check_output_dir(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    throw Error(dir.string(),
                "cannot create the output directory" + (ec ? ": " + ec.message() : std::string()));
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw Error(dir.string(), "the output directory is not writable");
}

void check_output_file(const fs::path& file, bool force) {
  if (fs::exists(file) && !force)
    throw Error(file.string(),
                "exists; pass --force to replace it (outputs are never "
                "overwritten silently)");
  if (fs::exists(file) && !fs::is_regular_file(file))
    throw Error(file.string(), "exists and is not a regular file");
  const fs::path dir = file.parent_path().empty() ? fs::path(".") : file.parent_path();
  if (!fs::is_directory(dir))
    throw Error(file.string(), "its directory " + dir.string() + " does not exist");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw Error(file.string(), "its directory " + dir.string() + " is not writable");
}

void add_memory_budget_option(CLI::App* cmd, std::string& value) {
  cmd->add_option("--memory-budget", value,
                  "memory the reference may use, e.g. 6G (default: what the machine has "
                  "available); a checkpoint larger than this is streamed one decoder layer at a "
                  "time")
      ->check([](const std::string& v) {
        try {
          parse_memory_size(v, "--memory-budget");
          return std::string();
        } catch (const Error& e) {
          return std::string(e.what());
        }
      });
}

uint64_t memory_budget_of(const std::string& value) {
  return value.empty() ? 0 : parse_memory_size(value, "--memory-budget");
}

}  // namespace qparity::cli
