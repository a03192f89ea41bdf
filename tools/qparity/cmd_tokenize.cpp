// `qparity tokenize --model DIR --text FILE [--out FILE] [--no-special-tokens]`: the checkpoint's
// own tokenizer (core/text/tokenizer.h) over UTF-8 text, the ids written space-separated (the
// --tokens FILE format every run command reads), the tokenizer's description and the count on
// stderr. What `--text` does inside trace / golden make / validate / engine run, on its own: to
// look at the ids, or to check them against another tokenizer (tools/device/tokenizer_peer.py).
#include <fstream>
#include <iostream>
#include <memory>
#include <span>
#include <sstream>

#include "core/error.h"
#include "core/input_file.h"
#include "core/safetensors/safetensors_writer.h"
#include "core/text/tokenizer.h"
#include "tools/qparity/cli_support.h"
#include "tools/qparity/commands.h"

namespace qparity::cli {

namespace {

struct TokenizeOptions {
  std::string model, text, out;
  bool no_special = false, force = false;
};

void run(const TokenizeOptions& o) {
  if (!o.out.empty()) check_output_file(o.out, o.force);
  const Tokenizer tok = Tokenizer::load(o.model);
  std::stringstream ss;
  ss << read_input_file(o.text, "text file");
  std::vector<int64_t> ids;
  try {
    ids = tok.encode(ss.str(), !o.no_special);
  } catch (const Error& e) {
    throw Error(o.text, e.what());
  }
  std::ostringstream line;
  for (size_t i = 0; i < ids.size(); ++i)
    line << (i ? " " : "") << ids[i];
  line << "\n";
  if (o.out.empty()) {
    std::cout << line.str();
  } else {
    // Through the one writer: a unique temporary beside the target (O_EXCL, never a fixed
    // name a link could redirect), then link (refusing) or rename (--force).
    const std::string text = line.str();
    write_file_atomic(
        o.out, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()),
        o.force ? OverwritePolicy::kReplace : OverwritePolicy::kRefuse);
  }
  std::cerr << "qparity tokenize: " << ids.size() << " ids by " << tok.description() << "\n";
}

}  // namespace

void add_tokenize_command(CLI::App& app, int& rc) {
  auto o = std::make_shared<TokenizeOptions>();
  auto* cmd = app.add_subcommand("tokenize",
                                 "Token ids of UTF-8 text by the checkpoint's own tokenizer.json");
  cmd->add_option("--model", o->model, "checkpoint directory (its tokenizer.json)")->required();
  cmd->add_option("--text", o->text, "UTF-8 text file ('-': standard input)")->required();
  cmd->add_option("--out", o->out, "write the ids here (default: standard output)");
  cmd->add_flag("--no-special-tokens", o->no_special,
                "leave out the post-processor's special tokens (BOS)");
  cmd->add_flag("--force", o->force, "replace an existing output file");
  cmd->callback([o, &rc] {
    run(*o);
    rc = 0;
  });
}

}  // namespace qparity::cli
