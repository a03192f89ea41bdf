// qparity: the numerical-truth toolkit for quantized LLM inference.
#include <cstdio>
#include <exception>
#include <iostream>

#include <CLI/CLI.hpp>

#include "core/error.h"
#include "tools/qparity/commands.h"

int main(int argc, char** argv) {
  CLI::App app{
      "qparity - numerical truth for quantized LLM inference.\n"
      "An exact fp64 reference for quantization formats, layer-by-layer comparison of engines\n"
      "against it, and bisection of the first place an engine leaves tolerance."};
  app.set_version_flag("--version", "qparity 0.1.0");
  app.require_subcommand(1);
  int rc = 0;
  qparity::cli::add_schemes_command(app, rc);
  qparity::cli::add_inspect_command(app, rc);
  qparity::cli::add_quant_linear_command(app, rc);
  qparity::cli::add_make_fixture_command(app, rc);
  qparity::cli::add_trace_command(app, rc);
  qparity::cli::add_quantize_command(app, rc);
  qparity::cli::add_golden_command(app, rc);
  qparity::cli::add_compare_command(app, rc);
  qparity::cli::add_report_command(app, rc);
  qparity::cli::add_validate_command(app, rc);
#ifdef QPARITY_HAS_ENGINE
  qparity::cli::add_engine_command(app, rc);
#endif
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help / --version exit 0; usage errors exit 2 (bad input files exit 1, below).
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  } catch (const qparity::Error& e) {
    // Bad input: one line naming the file / tensor / key and the violated rule.
    std::cerr << "qparity: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "qparity: error: " << e.what() << "\n";
    return 1;
  }
  return rc;
}
