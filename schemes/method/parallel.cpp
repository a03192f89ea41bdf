#include "schemes/method/parallel.h"

#include <string>

#include "core/error.h"

namespace qparity::reference {

int reference_threads() {
  return omp_get_max_threads();
}

void set_reference_threads(int n) {
  if (n < 1) throw Error("threads", "thread count must be >= 1, got " + std::to_string(n));
  omp_set_num_threads(n);
}

}  // namespace qparity::reference
