#pragma once
// Each subcommand registers itself on the CLI11 app and returns its exit status through `rc`.
#include <CLI/CLI.hpp>

namespace qparity::cli {

void add_schemes_command(CLI::App& app, int& rc);
void add_inspect_command(CLI::App& app, int& rc);
void add_quant_linear_command(CLI::App& app, int& rc);
void add_make_fixture_command(CLI::App& app, int& rc);
void add_trace_command(CLI::App& app, int& rc);
void add_trace_vision_command(CLI::App& app, int& rc);
void add_quantize_command(CLI::App& app, int& rc);
void add_golden_command(CLI::App& app, int& rc);
void add_compare_command(CLI::App& app, int& rc);
void add_report_command(CLI::App& app, int& rc);
void add_validate_command(CLI::App& app, int& rc);
void add_tokenize_command(CLI::App& app, int& rc);
void add_catalog_command(CLI::App& app, int& rc);
void add_judge_matrix_command(CLI::App& app, int& rc);
#ifdef QPARITY_HAS_ENGINE
void add_engine_command(CLI::App& app, int& rc);
#endif

}  // namespace qparity::cli
