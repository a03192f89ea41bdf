#pragma once
// Parallel loops whose results cannot depend on the thread count: the index range is cut into
// contiguous chunks, one per OpenMP thread, and every index owns its outputs and computes them
// with its own fixed-order reductions. No value is ever reduced across threads, so 1 thread and
// 16 threads produce the same bits (ARCHITECTURE.md: deterministic whatever the thread count).
#include <cstdint>
#include <exception>
#include <vector>

#include <omp.h>

namespace qparity::reference {

// Threads the reference uses (OpenMP's, i.e. OMP_NUM_THREADS or the core count by default).
int reference_threads();
void set_reference_threads(int n);

// fn(begin, end) over [0, n) in contiguous chunks, one per thread; serial when `work` (a rough
// count of multiply-adds) is too small to pay for the threads. An exception from any chunk is
// rethrown after the loop: the one from the lowest chunk, so the error does not depend on
// scheduling either.
template <typename Fn>
void parallel_chunks(int64_t n, int64_t work, Fn&& fn) {
  constexpr int64_t kMinParallelWork = int64_t{1} << 16;
  if (n <= 1 || work < kMinParallelWork || omp_get_max_threads() == 1 || omp_in_parallel()) {
    fn(int64_t{0}, n);
    return;
  }
  std::vector<std::exception_ptr> errors(static_cast<size_t>(omp_get_max_threads()));
#pragma omp parallel
  {
    const int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t begin = n * id / nt, end = n * (id + 1) / nt;
    try {
      if (begin < end) fn(begin, end);
    } catch (...) {
      errors[static_cast<size_t>(id)] = std::current_exception();
    }
  }
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace qparity::reference
