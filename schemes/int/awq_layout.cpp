#include "schemes/int/awq_layout.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "schemes/int/gptq_layout.h"

namespace qparity::reference {

namespace {

size_t sz(int64_t v) {
  return static_cast<size_t>(v);
}

void check_awq(const QuantArgs& a, int64_t n, const std::string& where) {
  if (a.num_bits != 4)
    throw Error(where, "AWQ's GEMM layout packs 4-bit codes, got " + std::to_string(a.num_bits));
  if (a.symmetric)
    throw Error(where, "AWQ's GEMM layout stores zero points (zero_point true); got symmetric");
  if (a.actorder == ActOrder::kGroup) throw Error(where, "AWQ has no act order");
  if (n % 8 != 0)
    throw Error(where, "out_features " + std::to_string(n) +
                           " is not a multiple of 8 (AWQ packs "
                           "8 columns per int32 word)");
}

// [rows, cols] unsigned nibbles -> [rows, cols/8] words in AWQ's order, and back.
std::vector<int64_t> pack_awq(const std::vector<int64_t>& u, int64_t rows, int64_t cols,
                              const std::string& where) {
  std::vector<int64_t> out(sz(rows * cols / 8));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols / 8; ++c) {
      uint32_t word = 0;
      for (int i = 0; i < 8; ++i) {
        const int64_t v = u[sz(r * cols + 8 * c + kAwqOrder[i])];
        if (v < 0 || v > 15)
          throw Error(where, "value " + std::to_string(v) + " at [" + std::to_string(r) + ", " +
                                 std::to_string(8 * c + kAwqOrder[i]) + "] is not a nibble");
        word |= static_cast<uint32_t>(v) << (4 * i);
      }
      out[sz(r * cols / 8 + c)] = static_cast<int32_t>(word);
    }
  return out;
}

std::vector<int64_t> unpack_awq(const std::vector<int64_t>& words, int64_t rows, int64_t cols) {
  std::vector<int64_t> u(sz(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols / 8; ++c) {
      const auto word = static_cast<uint32_t>(words[sz(r * cols / 8 + c)]);
      for (int i = 0; i < 8; ++i)
        u[sz(r * cols + 8 * c + kAwqOrder[i])] = (word >> (4 * i)) & 0xF;
    }
  return u;
}

}  // namespace

std::vector<ParamSpec> awq_specs(const QuantArgs& a, int64_t n, int64_t k,
                                 std::vector<DType> scale_dtypes) {
  check_awq(a, n, "awq");
  const int64_t groups = k / pack_quantized_group(a, k, "awq");
  return {{"qweight", {DType::kI32}, {k, n / 8}, true, "AWQ-order nibbles along N"},
          {"qzeros", {DType::kI32}, {groups, n / 8}, true, "AWQ-order nibbles along N"},
          {"scales", std::move(scale_dtypes), {groups, n}, true, ""}};
}

IntWeight decode_awq(const std::function<const HostTensor*(const std::string&)>& get,
                     const std::function<std::string(const std::string&)>& where,
                     const QuantArgs& a, int64_t n, int64_t k) {
  const auto need = [&](const std::string& name) -> const HostTensor& {
    const HostTensor* t = get(name);
    if (!t) throw Error(where(name), "missing");
    return *t;
  };
  check_awq(a, n, where("qweight"));
  const int64_t gsize = pack_quantized_group(a, k, where("qweight"));
  IntWeight w;
  w.rows = n;
  w.cols = k;
  w.groups = k / gsize;
  const std::string wq = where("qweight"), wz = where("qzeros"), ws = where("scales");
  const auto words = decode_ints(need("qweight").view(), wq);
  if (static_cast<int64_t>(words.size()) != k * n / 8)
    throw Error(wq, "holds " + std::to_string(words.size()) + " words, expected [" +
                        std::to_string(k) + ", " + std::to_string(n / 8) + "]");
  const auto u = unpack_awq(words, k, n);  // [K, N]
  w.q.resize(sz(n * k));
  for (int64_t r = 0; r < k; ++r)
    for (int64_t c = 0; c < n; ++c)
      w.q[sz(c * k + r)] = u[sz(r * n + c)] - 8;
  const auto zwords = decode_ints(need("qzeros").view(), wz);
  if (static_cast<int64_t>(zwords.size()) != w.groups * n / 8)
    throw Error(wz, "holds " + std::to_string(zwords.size()) + " words, expected [" +
                        std::to_string(w.groups) + ", " + std::to_string(n / 8) + "]");
  const auto z = unpack_awq(zwords, w.groups, n);  // [G, N]
  w.zero.resize(sz(n * w.groups));
  for (int64_t g = 0; g < w.groups; ++g)
    for (int64_t c = 0; c < n; ++c)
      w.zero[sz(c * w.groups + g)] = z[sz(g * n + c)] - 8;
  w.scales = group_major_scales(need("scales"), n, w.groups, ws);
  w.group.resize(sz(k));
  for (int64_t c = 0; c < k; ++c)
    w.group[sz(c)] = c / gsize;
  return w;
}

TensorMap encode_awq(const IntWeight& w, int bits, DType scale_dtype, const std::string& where) {
  if (bits != 4) throw Error(where, "AWQ's GEMM layout packs 4-bit codes");
  const int64_t n = w.rows, k = w.cols;
  if (n % 8 != 0) throw Error(where, "out_features is not a multiple of 8");
  for (int64_t c = 0; c < k; ++c)
    if (w.group[sz(c)] != c / (k / w.groups))
      throw Error(where, "AWQ has no act order: groups must be in column order");
  std::vector<int64_t> u(sz(k * n)), z(sz(w.groups * n));
  for (int64_t r = 0; r < k; ++r)
    for (int64_t c = 0; c < n; ++c)
      u[sz(r * n + c)] = w.q[sz(c * k + r)] + 8;
  for (int64_t g = 0; g < w.groups; ++g)
    for (int64_t c = 0; c < n; ++c)
      z[sz(g * n + c)] = w.zero[sz(c * w.groups + g)] + 8;
  std::vector<double> scales(sz(w.groups * n));
  for (int64_t g = 0; g < w.groups; ++g)
    for (int64_t c = 0; c < n; ++c)
      scales[sz(g * n + c)] = w.scales(c, g);
  TensorMap out;
  out["qweight"] = encode_ints(DType::kI32, {k, n / 8}, pack_awq(u, k, n, where + ".qweight"),
                               where + ".qweight");
  out["qzeros"] = encode_ints(DType::kI32, {w.groups, n / 8},
                              pack_awq(z, w.groups, n, where + ".qzeros"), where + ".qzeros");
  out["scales"] = encode(scale_dtype, {w.groups, n}, scales, Encoding::kExact, where + ".scales");
  return out;
}

IntWeight quantize_awq_rtn(const Matrix& x, int bits, int64_t group_size, bool symmetric,
                           DType scale_dtype, bool exact, const std::string& where) {
  require_finite(x.data, where);
  if (bits != 4 || symmetric)
    throw Error(where, "AutoAWQ's GEMM layout takes 4-bit codes with zero points only");
  const int64_t n = x.rows, k = x.cols;
  if (group_size <= 0 || k % group_size != 0)
    throw Error(where, "group_size " + std::to_string(group_size) + " does not divide K " +
                           std::to_string(k));
  const Arith a = exact ? Arith::kFp64 : Arith::kFp16;
  const Arith store = arith_of(scale_dtype, where);
  IntWeight w;
  w.rows = n;
  w.cols = k;
  w.groups = k / group_size;
  w.group.resize(sz(k));
  for (int64_t c = 0; c < k; ++c)
    w.group[sz(c)] = c / group_size;
  w.q.resize(sz(n * k));
  w.zero.assign(sz(n * w.groups), 0);
  w.scales = Matrix(n, w.groups);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t g = 0; g < w.groups; ++g) {
      double mn = in(a, x(r, g * group_size)), mx = mn;
      for (int64_t c = g * group_size; c < (g + 1) * group_size; ++c) {
        mn = std::min(mn, in(a, x(r, c)));
        mx = std::max(mx, in(a, x(r, c)));
      }
      const double s = div_in(a, std::max(sub_in(a, mx, mn), in(a, 1e-5)), 15.0);
      const double stored = in(store, s);
      if (!(stored > 0) || !std::isfinite(stored))
        throw Error(where, "row " + std::to_string(r) + ", group " + std::to_string(g) +
                               ": scale " + std::to_string(s) + " is not a positive finite " +
                               std::string(dtype_name(scale_dtype)) + " value");
      const double zq =
          exact ? int_of_quotient(mn, 1.0, s) : round_int(div_in(a, mn, s), IntRound::kHalfEven);
      const int64_t zu = std::clamp<int64_t>(-static_cast<int64_t>(zq), 0, 15);
      w.scales(r, g) = stored;
      w.zero[sz(r * w.groups + g)] = zu - 8;
      for (int64_t c = g * group_size; c < (g + 1) * group_size; ++c) {
        const double t = exact ? int_of_quotient(x(r, c), 1.0, stored)
                               : round_int(div_in(a, in(a, x(r, c)), stored), IntRound::kHalfEven);
        w.q[sz(r * k + c)] = std::clamp<int64_t>(static_cast<int64_t>(t) + zu, 0, 15) - 8;
      }
    }
  return w;
}

}  // namespace qparity::reference
