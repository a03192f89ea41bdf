// A stand-in for a C++ inference engine, as a downstream project would write its dump step: it
// computes each sequence with qparity's fp64 reference in emulate mode (`qparity trace --mode
// emulate`: bf16 activations between ops, the dialect's quantization arithmetic, which is what a
// correct engine computes) and writes what it computed through the C++ dump API
// (qparity/golden/candidate_writer.h). With --plant-fault TENSOR it runs a copy of the
// checkpoint in which that bf16 tensor is doubled, while the candidate names the original
// checkpoint: an engine that loads one scale wrong. The CI of this example expects that dump to
// FAIL and bisect to name the layer.
//
//   reference_as_engine --qparity EXE --model DIR --tokens FILE --seq-len T --out CANDIDATE
//                       [--dialect D] [--plant-fault TENSOR] --work DIR
#include <spawn.h>
#include <sys/wait.h>

#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/input_file.h"
#include "core/safetensors/safetensors_file.h"
#include "core/safetensors/safetensors_writer.h"
#include "qparity/golden/candidate_writer.h"

extern char** environ;

namespace fs = std::filesystem;
using qparity::Error;

namespace {

struct Options {
  std::string qparity, model, tokens, out, work, dialect = "vllm", plant_fault;
  int64_t seq_len = 0;
};

Options parse(int argc, char** argv) {
  Options o;
  std::map<std::string, std::string*> flags = {{"--qparity", &o.qparity},
                                               {"--model", &o.model},
                                               {"--tokens", &o.tokens},
                                               {"--out", &o.out},
                                               {"--work", &o.work},
                                               {"--dialect", &o.dialect},
                                               {"--plant-fault", &o.plant_fault}};
  std::string seq_len;
  flags["--seq-len"] = &seq_len;
  for (int i = 1; i < argc; i += 2) {
    const auto it = flags.find(argv[i]);
    if (it == flags.end() || i + 1 >= argc)
      throw Error("reference_as_engine",
                  std::string("unknown option or missing value: ") + argv[i]);
    *it->second = argv[i + 1];
  }
  for (const auto& [flag, value] : flags)
    if (value->empty() && flag != "--plant-fault")
      throw Error("reference_as_engine", flag + " is required");
  o.seq_len = std::stoll(seq_len);
  return o;
}

// One sequence per line, seq_len ids each.
std::vector<int64_t> read_tokens(const Options& o, int64_t& sequences) {
  std::istringstream in(qparity::read_input_file(o.tokens, "token file"));
  std::vector<int64_t> ids;
  for (int64_t id; in >> id;)
    ids.push_back(id);
  if (ids.empty() || ids.size() % static_cast<size_t>(o.seq_len) != 0)
    throw Error(o.tokens, std::to_string(ids.size()) + " ids are not whole sequences of " +
                              std::to_string(o.seq_len));
  sequences = static_cast<int64_t>(ids.size()) / o.seq_len;
  return ids;
}

void run(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0)
    throw Error(args[0], std::string("cannot start: ") + std::strerror(errno));
  int status = 0;
  if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw Error(args[0], args[1] + " failed (status " + std::to_string(status) + ")");
}

// A copy of the checkpoint with `tensor` (BF16) doubled: +1 on every normal value's exponent.
fs::path plant_fault(const Options& o) {
  const fs::path dst = fs::path(o.work) / "faulty-model";
  fs::create_directories(dst);
  bool found = false;
  for (const auto& e : fs::directory_iterator(o.model)) {
    if (!e.is_regular_file()) continue;
    const fs::path to = dst / e.path().filename();
    if (e.path().extension() != ".safetensors") {
      fs::copy_file(e.path(), to, fs::copy_options::overwrite_existing);
      continue;
    }
    const auto f = qparity::SafetensorsFile::open(e.path());
    std::vector<std::vector<uint8_t>> keep;
    keep.reserve(f.tensors().size());
    std::vector<qparity::TensorToWrite> tensors;
    for (const auto& t : f.tensors()) {
      const auto bytes = f.bytes(t);
      keep.emplace_back(bytes.begin(), bytes.end());
      if (t.name == o.plant_fault) {
        if (t.dtype != qparity::DType::kBF16)
          throw Error(t.name, "--plant-fault takes a BF16 tensor");
        for (size_t i = 0; i + 1 < keep.back().size(); i += 2) {
          uint16_t v = static_cast<uint16_t>(keep.back()[i] | keep.back()[i + 1] << 8);
          const unsigned exponent = (v >> 7) & 0xffu;
          if (exponent >= 1 && exponent <= 253) v = static_cast<uint16_t>(v + (1u << 7));
          keep.back()[i] = static_cast<uint8_t>(v & 0xff);
          keep.back()[i + 1] = static_cast<uint8_t>(v >> 8);
        }
        found = true;
      }
      tensors.push_back({t.name, t.dtype, t.shape, keep.back()});
    }
    std::optional<std::map<std::string, std::string>> meta;
    if (f.header().has_metadata) meta = f.metadata();
    qparity::write_safetensors(to, std::move(tensors), meta, qparity::OverwritePolicy::kReplace);
  }
  if (!found) throw Error(o.model, "no tensor " + o.plant_fault + " (--plant-fault)");
  return dst;
}

std::vector<double> f64_values(const qparity::SafetensorsFile& f, const qparity::TensorInfo& t) {
  if (t.dtype != qparity::DType::kF64) throw Error(f.path().string(), t.name + " is not F64");
  std::vector<double> v(t.numel());
  std::memcpy(v.data(), f.bytes(t).data(), v.size() * sizeof(double));
  return v;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  int64_t sequences = 0;
  const std::vector<int64_t> tokens = read_tokens(o, sequences);
  fs::create_directories(o.work);
  const fs::path runs = o.plant_fault.empty() ? fs::path(o.model) : plant_fault(o);

  // The engine's numbers, one sequence at a time from an empty cache.
  std::map<std::string, std::pair<int64_t, std::vector<double>>> points;  // name -> width, rows
  std::vector<double> logits;
  std::vector<std::string> order;
  for (int64_t s = 0; s < sequences; ++s) {
    std::string ids;
    for (int64_t i = 0; i < o.seq_len; ++i)
      ids += (i ? "," : "") + std::to_string(tokens[static_cast<size_t>(s * o.seq_len + i)]);
    const fs::path trace = fs::path(o.work) / ("sequence-" + std::to_string(s) + ".safetensors");
    fs::remove(trace);
    run({o.qparity, "trace", "--model", runs.string(), "--token-ids", ids, "--mode", "emulate",
         "--dialect", o.dialect, "--out", trace.string()});
    const auto f = qparity::SafetensorsFile::open(trace);
    for (const auto& t : f.tensors()) {
      if (t.name == "tokens") continue;
      const std::vector<double> v = f64_values(f, t);
      if (t.name == "logits") {
        logits.insert(logits.end(), v.begin(), v.end());
        continue;
      }
      auto& [width, rows] = points[t.name];
      width = static_cast<int64_t>(t.shape.at(1));
      rows.insert(rows.end(), v.begin(), v.end());
      if (s == 0) order.push_back(t.name);
    }
  }

  qparity::golden::CandidateInfo info;
  info.producer = "reference-as-engine";
  info.producer_version = "qparity examples/downstream";
  info.dialect = o.dialect;
  info.precision_mode = "fp64 reference, emulate";
  info.device = "cpu";
  // Named after the checkpoint it was asked to run (the original, also under --plant-fault).
  qparity::golden::CandidateWriter w(o.model, tokens, sequences, o.seq_len, info);
  for (const auto& name : order)
    w.add_point(name, points[name].second, points[name].first);
  w.set_logits(logits);
  w.write(o.out);
  std::cerr << "reference_as_engine: " << sequences << " x " << o.seq_len << " tokens, "
            << order.size() << " capture points"
            << (o.plant_fault.empty() ? "" : ", fault planted in " + o.plant_fault) << " -> "
            << o.out << "\n";
  return 0;
} catch (const std::exception& e) {
  std::cerr << "reference_as_engine: error: " << e.what() << "\n";
  return 1;
}
