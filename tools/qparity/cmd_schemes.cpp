// `qparity schemes [--json] [--dialects]`: every scheme with its parameters, constraints and
// checkpoint tensor names, from the scheme registry (the same data the planner uses); with
// --dialects, the dialects the reference can reproduce (the --dialect values).
#include <iostream>

#include "core/quant/dialect.h"
#include "core/quant/scheme_registry.h"
#include "tools/qparity/commands.h"

namespace qparity::cli {

namespace {

void print_text(std::ostream& os) {
  for (const SchemeInfo& s : all_schemes()) {
    os << s.id << "  [" << to_string(s.family) << "; ";
    for (size_t i = 0; i < s.producers.size(); ++i)
      os << (i ? ", " : "") << to_string(s.producers[i]);
    os << "]\n    " << s.description << "\n";
    for (const auto& p : s.parameters)
      os << "    param " << p.name << " = " << p.value << "  (" << p.description << ")\n";
    for (const auto& c : s.constraints)
      os << "    constraint: " << c << "\n";
    for (const auto& t : s.tensors) {
      os << "    tensor " << t.name << "  " << t.dtype << " " << t.shape;
      if (!t.producer.empty()) os << "  [" << t.producer << "]";
      if (!t.note.empty()) os << "  - " << t.note;
      os << "\n";
    }
    if (!s.spec.empty()) os << "    spec: " << s.spec << "\n";
    os << "\n";
  }
}

}  // namespace

void add_schemes_command(CLI::App& app, int& rc) {
  auto* cmd = app.add_subcommand("schemes",
                                 "List every quantization scheme: parameters, "
                                 "constraints, checkpoint tensors");
  auto json = std::make_shared<bool>(false);
  auto dialects = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json, "Print JSON instead of text");
  cmd->add_flag("--dialects", *dialects,
                "List the dialects (producer / engine arithmetic the reference reproduces)");
  cmd->callback([json, dialects, &rc] {
    if (*dialects) {
      Json out = Json::array();
      for (Dialect d : kAllDialects) {
        if (*json)
          out.push_back({{"id", std::string(qparity::to_string(d))},
                         {"description", std::string(qparity::describe(d))}});
        else
          std::cout << qparity::to_string(d) << "\n    " << qparity::describe(d) << "\n";
      }
      if (*json) std::cout << out.dump(2) << "\n";
    } else if (*json) {
      Json out = Json::array();
      for (const SchemeInfo& s : all_schemes())
        out.push_back(to_json(s));
      std::cout << out.dump(2) << "\n";
    } else {
      print_text(std::cout);
    }
    rc = 0;
  });
}

}  // namespace qparity::cli
