#include "schemes/math/matmul.h"

#include <algorithm>
#include <atomic>

#include "core/error.h"
#include "schemes/math/simd_kernels.h"
#include "schemes/method/parallel.h"

namespace qparity::reference {

Matrix matmul_nt(const Matrix& x, const Matrix& w) {
  if (x.cols != w.cols)
    throw Error("matmul_nt", "inner dimensions differ: x has " + std::to_string(x.cols) +
                                 " columns, w has " + std::to_string(w.cols));
  return matmul_nt_rows(x, w.rows, [&](int64_t r, int64_t k0, std::span<double> out) {
    std::copy_n(w.row(r).begin() + k0, out.size(), out.begin());
  });
}

namespace {

std::atomic<DotKernel> g_kernel{DotKernel::kAuto};

bool cpu_can_run(DotKernel k) {
  switch (k) {
    case DotKernel::kAuto:
    case DotKernel::kPortable:
      return true;
    case DotKernel::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case DotKernel::kAvx512:
      return __builtin_cpu_supports("avx512f");
  }
  return false;
}

struct Kernel {
  kernels::DotPanel dot;
  kernels::TransposeBlock transpose;
  int64_t rows;   // panel rows
  int64_t block;  // columns decoded and transposed at a time
};

Kernel kernel_of(DotKernel k) {
  switch (k) {
    case DotKernel::kAvx512:
      return {kernels::dot_panel_avx512, kernels::transpose_avx512, kernels::kAvx512Rows,
              kernels::kAvx512Block};
    case DotKernel::kAvx2:
      return {kernels::dot_panel_avx2, kernels::transpose_avx2, kernels::kAvx2Rows,
              kernels::kAvx2Block};
    case DotKernel::kAuto:
    case DotKernel::kPortable:
      break;
  }
  return {kernels::dot_panel_portable, kernels::transpose_portable, kernels::kPortableRows,
          kernels::kPortableBlock};
}

}  // namespace

void set_dot_kernel(DotKernel kernel) {
  if (!cpu_can_run(kernel))
    throw Error("set_dot_kernel", std::string("the ") + dot_kernel_name(kernel) +
                                      " kernel asked for on a CPU without its instructions");
  g_kernel.store(kernel);
}

DotKernel dot_kernel() {
  const DotKernel k = g_kernel.load();
  if (k != DotKernel::kAuto) return k;
  static const DotKernel best = cpu_can_run(DotKernel::kAvx512) ? DotKernel::kAvx512
                                : cpu_can_run(DotKernel::kAvx2) ? DotKernel::kAvx2
                                                                : DotKernel::kPortable;
  return best;
}

const char* dot_kernel_name(DotKernel kernel) {
  switch (kernel) {
    case DotKernel::kAuto:
      return "auto";
    case DotKernel::kPortable:
      return "portable";
    case DotKernel::kAvx2:
      return "avx2";
    case DotKernel::kAvx512:
      return "avx512";
  }
  return "?";
}

DotKernel parse_dot_kernel(const std::string& name) {
  for (const DotKernel k :
       {DotKernel::kAuto, DotKernel::kPortable, DotKernel::kAvx2, DotKernel::kAvx512})
    if (name == dot_kernel_name(k)) return k;
  throw Error("--kernel",
              "unknown product kernel '" + name + "' (valid: auto, portable, avx2, avx512)");
}

namespace {

// The loop behind both products. Weight rows go `rows` at a time into a panel, a column block at a
// time: the block decoded, transposed, and every token's partial sums continued over it. The
// segments [cuts[s], cuts[s + 1]) cut K into separate sums; when segment s is complete,
// segment_done(r, nr, s, out) reads its sums, out[t * rows + j] for token t and panel row j < nr.
// panel_start(r, nr) runs before a panel's first block.
template <class PanelStart, class SegmentDone>
void panel_loop(const Matrix& x, int64_t n, const WeightRows& row, std::span<const int64_t> cuts,
                const PanelStart& panel_start, const SegmentDone& segment_done) {
  const int64_t k = x.cols;
  const Kernel kern = kernel_of(dot_kernel());
  const int64_t R = kern.rows;
  const auto segs = static_cast<int64_t>(cuts.size()) - 1;
  std::vector<const double*> xr(static_cast<size_t>(x.rows));
  for (int64_t t = 0; t < x.rows; ++t)
    xr[static_cast<size_t>(t)] = x.data.data() + t * k;
  parallel_chunks(n, x.rows * n * k, [&](int64_t r0, int64_t r1) {
    std::vector<double> block(static_cast<size_t>(R * kern.block)),
        panel(static_cast<size_t>(kern.block * R)), out(static_cast<size_t>(x.rows * R));
    for (int64_t r = r0; r < r1; r += R) {
      const int64_t nr = std::min(R, r1 - r);
      panel_start(r, nr);
      int64_t s = 0;
      for (int64_t c0 = 0; c0 < k; c0 += kern.block) {
        const int64_t c1 = std::min(k, c0 + kern.block), w = c1 - c0;
        // Decode the rows' block side by side, then transpose it into the panel (writing each
        // row straight into the panel would stride every store); rows past nr are zeros.
        for (int64_t j = 0; j < nr; ++j)
          row(r + j, c0, std::span<double>(block.data() + j * w, static_cast<size_t>(w)));
        if (nr < R) std::fill(block.begin() + nr * w, block.begin() + R * w, 0.0);
        kern.transpose(block.data(), w, panel.data());
        for (; s < segs && cuts[s] < c1; ++s) {
          const int64_t a = std::max(cuts[s], c0), b = std::min(cuts[s + 1], c1);
          if (a == cuts[s] && a == b) std::fill(out.begin(), out.end(), 0.0);
          if (a < b)
            kern.dot(xr.data(), x.rows, panel.data() + (a - c0) * R, a, b, a == cuts[s],
                     out.data());
          if (cuts[s + 1] > c1) break;  // continues in the next block
          segment_done(r, nr, s, out.data());
        }
      }
      for (; s < segs; ++s) {  // empty segments at K (all of them when K = 0): sums of 0
        std::fill(out.begin(), out.end(), 0.0);
        segment_done(r, nr, s, out.data());
      }
    }
  });
}

void check_cuts(std::span<const int64_t> cuts, int64_t k) {
  bool ok = cuts.size() >= 2 && cuts.front() == 0 && cuts.back() == k;
  for (size_t i = 1; ok && i < cuts.size(); ++i)
    ok = cuts[i - 1] <= cuts[i];
  if (!ok)
    throw Error("matmul_nt_rows_segmented",
                "segment cuts must run from 0 to K = " + std::to_string(k) + " in ascending order");
}

}  // namespace

Matrix matmul_nt_rows(const Matrix& x, int64_t n, const WeightRows& row) {
  Matrix y(x.rows, n);
  const int64_t R = kernel_of(dot_kernel()).rows;
  const int64_t cuts[] = {0, x.cols};
  panel_loop(
      x, n, row, cuts, [](int64_t, int64_t) {},
      [&](int64_t r, int64_t nr, int64_t, const double* out) {
        for (int64_t t = 0; t < x.rows; ++t)
          for (int64_t j = 0; j < nr; ++j)
            y(t, r + j) = out[t * R + j];
      });
  return y;
}

Matrix matmul_nt_rows_segmented(const Matrix& x, int64_t n, const WeightRows& row,
                                const SegmentedScales& sc) {
  check_cuts(sc.cuts, x.cols);
  const auto segs = static_cast<int64_t>(sc.cuts.size()) - 1;
  if (sc.sx && (sc.sx->rows != x.rows || sc.sx->cols != segs))
    throw Error("matmul_nt_rows_segmented", "activation scales are not [T, segments]");
  Matrix y(x.rows, n);
  const int64_t R = kernel_of(dot_kernel()).rows;
  // Per-thread scratch: the running folds and the panel rows' scales.
  thread_local std::vector<double> acc, sw;
  panel_loop(
      x, n, row, sc.cuts,
      [&](int64_t r, int64_t nr) {
        acc.assign(static_cast<size_t>(x.rows * R), 0.0);
        sw.assign(static_cast<size_t>(R * segs), 0.0);
        for (int64_t j = 0; j < nr; ++j)
          sc.row_scales(r + j, std::span<double>(sw.data() + j * segs, static_cast<size_t>(segs)));
      },
      [&](int64_t r, int64_t nr, int64_t s, const double* out) {
        for (int64_t t = 0; t < x.rows; ++t) {
          const double sxv = sc.sx ? (*sc.sx)(t, s) : 1.0;
          for (int64_t j = 0; j < nr; ++j) {
            const double d = out[t * R + j];
            if (sc.int32_check && (d > 2147483647.0 || d < -2147483648.0))
              throw Error("scaled_gemm", "int32 accumulator overflow at output (" +
                                             std::to_string(t) + ", " + std::to_string(r + j) +
                                             ")");
            double& a = acc[static_cast<size_t>(t * R + j)];
            a = a + ((d * sc.lattice) * sxv) * sw[static_cast<size_t>(j * segs + s)];
          }
        }
        if (s + 1 == segs)
          for (int64_t t = 0; t < x.rows; ++t)
            for (int64_t j = 0; j < nr; ++j)
              y(t, r + j) = acc[static_cast<size_t>(t * R + j)];
      });
  return y;
}

}  // namespace qparity::reference
