#pragma once
// Paths that must not outlive an interrupted run: the temporary file of an atomic write, a
// validate run's work directory. A guard registers a path; Ctrl-C (SIGINT) or SIGTERM removes
// every registered path before the process dies with that signal; the guard's destructor
// unregisters it (and removes it when asked, as for a work directory on any exit).
#include <filesystem>

namespace qparity {

// Installs the SIGINT/SIGTERM handlers (once; later calls do nothing).
void install_cleanup_on_signal();

class TempPathGuard {
 public:
  enum class OnExit { kKeep, kRemove };
  explicit TempPathGuard(const std::filesystem::path& path, OnExit on_exit = OnExit::kKeep);
  TempPathGuard(const TempPathGuard&) = delete;
  TempPathGuard& operator=(const TempPathGuard&) = delete;
  ~TempPathGuard();
  // The path is kept from now on, even on a signal (the work it held was finished).
  void release();

 private:
  int slot_ = -1;
  std::filesystem::path path_;
  OnExit on_exit_;
};

}  // namespace qparity
