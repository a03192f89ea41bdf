// qparity: the numerical-truth toolkit for quantized LLM inference.
#include <cstdio>
#include <exception>
#include <functional>
#include <iostream>
#include <new>
#include <string>

#include <CLI/CLI.hpp>

#include "core/error.h"
#include "core/temp_cleanup.h"
#include "tools/qparity/commands.h"
#include "tools/qparity/huge_page_malloc.h"

int main(int argc, char** argv) {
  qparity::cli::reexec_with_huge_page_malloc(argv);
  CLI::App app{
      "qparity - numerical truth for quantized LLM inference.\n"
      "An exact fp64 reference for quantization formats, layer-by-layer comparison of engines\n"
      "against it, and bisection of the first place an engine leaves tolerance."};
  app.set_version_flag("--version", "qparity 0.1.0");
  app.require_subcommand(1);
  qparity::install_cleanup_on_signal();  // Ctrl-C leaves no temporary file behind
  int rc = 0;
  qparity::cli::add_schemes_command(app, rc);
  qparity::cli::add_inspect_command(app, rc);
  qparity::cli::add_quant_linear_command(app, rc);
  qparity::cli::add_make_fixture_command(app, rc);
  qparity::cli::add_trace_command(app, rc);
  qparity::cli::add_trace_vision_command(app, rc);
  qparity::cli::add_quantize_command(app, rc);
  qparity::cli::add_golden_command(app, rc);
  qparity::cli::add_compare_command(app, rc);
  qparity::cli::add_report_command(app, rc);
  qparity::cli::add_validate_command(app, rc);
  qparity::cli::add_tokenize_command(app, rc);
  qparity::cli::add_catalog_command(app, rc);
  qparity::cli::add_judge_matrix_command(app, rc);
#ifdef QPARITY_HAS_ENGINE
  qparity::cli::add_engine_command(app, rc);
#endif
  // An unknown first word is a mistyped subcommand: name it (CLI11 would only say that a
  // subcommand is required).
  if (argc > 1 && argv[1][0] != '-') {
    const std::string word = argv[1];
    bool known_word = false;
    std::string known;
    const CLI::App& capp = app;
    for (const CLI::App* sub : capp.get_subcommands(std::function<bool(const CLI::App*)>{})) {
      known_word = known_word || sub->get_name() == word;
      if (!sub->get_group().empty()) known += (known.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known_word) {
      std::cerr << "qparity: unknown command '" << word << "' (commands: " << known
                << "; see qparity --help)\n";
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help / --version exit 0; usage errors exit 2 (bad input files exit 1, below).
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  } catch (const qparity::UsageError& e) {
    std::cerr << "qparity: usage: " << e.what() << "\n";
    return 2;
  } catch (const qparity::Error& e) {
    // Bad input: one line naming the file / tensor / key and the violated rule.
    std::cerr << "qparity: error: " << e.what() << "\n";
    return 1;
  } catch (const std::bad_alloc&) {
    // Never a bare "std::bad_alloc": say what happened and what to do.
    std::cerr << "qparity: error: out of memory: the run needs more memory than this machine "
                 "can give (a larger input than intended, or use --memory-budget / --capture to "
                 "hold less)\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "qparity: error: " << e.what() << "\n";
    return 1;
  }
  return rc;
}
