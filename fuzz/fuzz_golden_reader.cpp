// libFuzzer: any byte string as a golden HDF5 file (golden/SCHEMA.md), read in full and compared
// against itself. Only qparity::Error may escape; anything else (another exception type, a
// sanitizer report, a hang, an HDF5 identifier left open) is a finding.
// libhdf5 1.10 itself crashes, hangs and leaks on some corrupt files (H5HG_read of a vlen string
// from a corrupt global heap; object headers), so a long run needs
//   LSAN_OPTIONS=suppressions=fuzz/fuzz_golden_reader.lsan.supp fuzz_golden_reader -fork=1
//   -ignore_crashes=1 -ignore_timeouts=1 -timeout=5 ...
// and each artifact's stack says whose bug it is.
#include <hdf5.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

#include "core/error.h"
#include "golden/compare.h"
#include "golden/golden_file.h"

namespace {

namespace fs = std::filesystem;
using qparity::golden::GoldenReader;

// GoldenReader takes a path: one file per process (jobs/fork workers each have their own), in
// RAM when /dev/shm exists. Removed after each input; a crash leaves it behind.
const fs::path& temp_path() {
  static const fs::path p = [] {
    std::error_code ec;
    const fs::path dir =
        fs::is_directory("/dev/shm", ec) ? fs::path("/dev/shm") : fs::temp_directory_path();
    return dir / ("qparity-fuzz-golden-" + std::to_string(getpid()) + ".h5");
  }();
  return p;
}

void write_input(const fs::path& path, const uint8_t* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || (size && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
    std::fprintf(stderr, "fuzz_golden_reader: cannot write %s\n", path.c_str());
    std::abort();
  }
}

// QPARITY_FUZZ_VERBOSE=1 prints why each input was rejected (to check that seeds open).
bool verbose() {
  static const bool v = std::getenv("QPARITY_FUZZ_VERBOSE") != nullptr;
  return v;
}

// Each read on its own, so one bad dataset does not hide the others.
template <typename F>
void attempt(const char* what, F&& f) {
  try {
    f();
    if (verbose()) std::fprintf(stderr, "  %s: ok\n", what);
  } catch (const qparity::Error& e) {
    if (verbose()) std::fprintf(stderr, "  %s: %s\n", what, e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fs::path& path = temp_path();
  write_input(path, data, size);
  attempt("open", [&] {
    const GoldenReader r = GoldenReader::open(path);
    for (const auto& name : r.point_names())
      attempt("point", [&] { (void)r.point(name); });
    attempt("logits", [&] { (void)r.logits(); });
    attempt("target_logprobs", [&] { (void)r.target_logprobs(); });
    attempt("sequence_nll", [&] { (void)r.sequence_nll(); });
    attempt("sequence_ppl", [&] { (void)r.sequence_ppl(); });
    attempt("activation_stats", [&] { (void)r.activation_stats(); });
    attempt("read_all", [&] { (void)r.read_all(); });
    attempt("compare", [&] { (void)qparity::golden::compare_goldens(r, r, {}); });
  });
  // The reader owns every identifier it opens; one left open would also make HDF5 reuse the
  // stale file for the next input written to the same path.
  const ssize_t open_ids = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
  if (open_ids != 0) {
    std::fprintf(stderr, "fuzz_golden_reader: %zd HDF5 identifiers left open\n", open_ids);
    std::abort();
  }
  std::remove(path.c_str());
  return 0;
}
