#include "tools/qparity/huge_page_malloc.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

namespace qparity::cli {

void reexec_with_huge_page_malloc(char** argv) {
  if (std::getenv("QPARITY_NO_HUGE_PAGES") != nullptr) return;
  const char* current = std::getenv("GLIBC_TUNABLES");
  std::string tunables = current ? current : "";
  if (tunables.find("glibc.malloc.hugetlb") != std::string::npos) return;  // set, or re-executed
  tunables += (tunables.empty() ? "" : ":") + std::string("glibc.malloc.hugetlb=1");
  if (setenv("GLIBC_TUNABLES", tunables.c_str(), 1) != 0) return;
  execv("/proc/self/exe", argv);
  // Only reached when the exec failed: run on as this process, without the tunable (setting it
  // back keeps what children inherit as it was).
  if (current)
    setenv("GLIBC_TUNABLES", current, 1);
  else
    unsetenv("GLIBC_TUNABLES");
}

}  // namespace qparity::cli
