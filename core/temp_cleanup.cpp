#include "core/temp_cleanup.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <climits>
#include <cstring>
#include <mutex>

namespace qparity {

namespace {

// A fixed table the signal handler can read without locks or allocation: a slot's path is
// written before its flag is set (release), and read after the flag is seen (acquire).
constexpr int kSlots = 64;
struct Slot {
  std::atomic<bool> used{false};
  char path[PATH_MAX] = {};
};
std::array<Slot, kSlots> g_slots;
std::mutex g_register;  // between registering threads only; the handler never takes it

// Removes one path from a signal handler: unlink for a file; a directory through rm -r in a
// child (fork, execve and waitpid are async-signal-safe; a recursive walk here would not be).
void remove_from_handler(const char* path) {
  if (::unlink(path) == 0 || errno == ENOENT) return;
  const pid_t pid = ::fork();
  if (pid == 0) {
    const char* argv[] = {"rm", "-rf", "--", path, nullptr};
    ::execv("/bin/rm", const_cast<char* const*>(argv));
    ::_exit(127);
  }
  if (pid > 0) ::waitpid(pid, nullptr, 0);
}

void on_signal(int sig) {
  for (auto& s : g_slots)
    if (s.used.load(std::memory_order_acquire)) remove_from_handler(s.path);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

void install_cleanup_on_signal() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
  });
}

TempPathGuard::TempPathGuard(const std::filesystem::path& path, OnExit on_exit)
    : path_(path), on_exit_(on_exit) {
  const std::string p = std::filesystem::absolute(path).string();
  if (p.size() >= PATH_MAX) return;  // too long to register: only the destructor removes it
  std::lock_guard<std::mutex> lock(g_register);
  for (int i = 0; i < kSlots; ++i)
    if (!g_slots[static_cast<size_t>(i)].used.load(std::memory_order_relaxed)) {
      std::memcpy(g_slots[static_cast<size_t>(i)].path, p.c_str(), p.size() + 1);
      g_slots[static_cast<size_t>(i)].used.store(true, std::memory_order_release);
      slot_ = i;
      return;
    }
}

void TempPathGuard::release() {
  if (slot_ >= 0) g_slots[static_cast<size_t>(slot_)].used.store(false, std::memory_order_release);
  slot_ = -1;
  on_exit_ = OnExit::kKeep;
}

TempPathGuard::~TempPathGuard() {
  if (slot_ >= 0) g_slots[static_cast<size_t>(slot_)].used.store(false, std::memory_order_release);
  if (on_exit_ == OnExit::kRemove) {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
}

}  // namespace qparity
