// `qparity catalog`: the capture-point catalog as the Python dump helper and golden/SCHEMA.md
// hold it (core/capture/catalog_export.h), generated so that neither keeps a copy of its own.
#include <iostream>
#include <memory>

#include "core/capture/catalog_export.h"
#include "core/error.h"
#include "tools/qparity/commands.h"

namespace qparity::cli {

void add_catalog_command(CLI::App& app, int& rc) {
  auto* cmd = app.add_subcommand(
      "catalog",
      "Print the capture-point catalog: python/qparity_dump/_points.py (--python) or "
      "golden/SCHEMA.md's table of points (--markdown)");
  auto python = std::make_shared<bool>(false);
  auto markdown = std::make_shared<bool>(false);
  cmd->add_flag("--python", *python, "The Python module (python/qparity_dump/_points.py)");
  cmd->add_flag("--markdown", *markdown, "The Markdown table (golden/SCHEMA.md, Capture points)")
      ->excludes("--python");
  cmd->callback([python, markdown, &rc] {
    if (!*python && !*markdown) throw UsageError("qparity catalog", "give --python or --markdown");
    std::cout << (*python ? catalog_python_module() : catalog_markdown_table());
    rc = 0;
  });
}

}  // namespace qparity::cli
