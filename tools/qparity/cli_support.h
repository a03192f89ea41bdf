#pragma once
// What several subcommands share: where the installed tolerance policies are, which policy a
// comparison implies when none is named, and output paths checked before any work starts.
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "golden/compare.h"
#include "golden/policy.h"
#include "golden/reference_run.h"

namespace qparity::cli {

// Data the tool installs beside itself, by directory name ("policies", "fixtures/trained"):
// <dir of the binary>/../share/qparity/<name> (an install tree, `cmake --install`), else
// <dir of the binary>/<name> (the build tree copies it there). Empty when neither exists.
std::filesystem::path installed_data_dir(const std::filesystem::path& name);
inline std::filesystem::path installed_policy_dir() {
  return installed_data_dir("policies");
}

// --policies DIR, or the installed directory; an error naming the directory when it is missing.
std::filesystem::path policy_dir(const std::string& option);

// Choices of the options several commands share, as CLI11 validators: a value outside them is a
// usage error (exit 2) naming the valid ones.
CLI::IsMember dialect_choices();  // ideal | compressed-tensors | vllm | sglang | msmodelslim
CLI::IsMember mode_choices();     // exact | emulate
CLI::IsMember role_choices();     // engine | format
// --seed: a non-negative integer (CLI11 would wrap "-5" into 2^64 - 5 for an unsigned seed).
CLI::Validator seed_check();

// engine | format, from --role; a UsageError for anything else.
golden::PolicyRole parse_role(const std::string& role);

// The role a comparison implies when --role is not given: format when the golden is the
// unquantized reference and the candidate the reference of a quantized scheme, else engine.
golden::PolicyRole implied_role(const golden::GoldenMeta& golden,
                                const golden::GoldenMeta& candidate);

// The policy to judge with: --policy FILE when given, else <policy dir>/<candidate scheme>.json
// when installed (`source` then says so), else none (the comparison is "not judged").
struct ChosenPolicy {
  std::optional<golden::Policy> policy;
  golden::PolicyRole role = golden::PolicyRole::kEngine;
  std::string source;  // "--policy", "implied by ...", or why there is none
};
ChosenPolicy choose_policy(const std::string& policy_option, const std::string& role_option,
                           const golden::GoldenMeta& golden, const golden::GoldenMeta& candidate);

// --budget "kld=0.05,top1=0.9,dln_ppl=0.02" (any subset, at least one): the format role's
// acceptance budget, applied to the 95% bounds (upper KLD and ln PPL ratio, lower top-1).
golden::EndToEndGate parse_budget(const std::string& text);
// --budget as given (`given`: the option appeared, even as ""): nullopt when absent; an empty
// value, or a comparison judged in the engine role, is a usage error (never silently ignored).
std::optional<golden::EndToEndGate> budget_for(const std::string& text, bool given,
                                               golden::PolicyRole role);

// Text in: --text FILE tokenized by the checkpoint's own tokenizer.json (in `model`), cut into
// sequences of --seq-len starting every --stride tokens (golden::tokenized_text_inputs).
struct TextInput {
  std::string file;
  std::string model;
  int64_t stride = 0;
};

// The token inputs of a run, one convention for every command: --tokens FILE (token ids,
// whitespace / comma separated; "-" reads standard input), --token-ids 1,2,3 (a literal list),
// --text FILE (text, the checkpoint's tokenizer), or --synthetic N (N sequences of --seq-len
// pseudo-random ids from --seed). Exactly one; anything else is a usage error naming `command`.
// seq_len 0 keeps a file's, list's or text's ids as one sequence.
golden::TokenInputs token_inputs(const std::string& command, const std::string& tokens_file,
                                 const std::string& token_ids, int64_t synthetic, int64_t seq_len,
                                 int64_t vocab, uint64_t seed, const TextInput& text = {});
// Registers --tokens, --token-ids, --text and --stride on a command (the texts name the
// convention above).
void add_token_options(CLI::App* cmd, std::string& tokens_file, std::string& token_ids,
                       TextInput& text);

// Fails now, naming the path, when `file` could not be written later: its directory missing or
// not writable, or the file present without --force.
void check_output_file(const std::filesystem::path& file, bool force);

// --memory-budget SIZE (core/memory_budget.h): the reference streams a checkpoint larger than it
// one decoder layer at a time. memory_budget_of: bytes, 0 when not given (the machine's
// available memory then).
void add_memory_budget_option(CLI::App* cmd, std::string& value);
uint64_t memory_budget_of(const std::string& value);
// Creates `dir` if needed and checks that a file can be written in it.
void check_output_dir(const std::filesystem::path& dir);

}  // namespace qparity::cli
