#include "schemes/int/gptq_layout.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace qparity::reference {

namespace {

size_t sz(int64_t v) {
  return static_cast<size_t>(v);
}

int64_t words_of(int64_t count, int bits, const std::string& what, const std::string& where) {
  if ((count * bits) % 32 != 0)
    throw Error(where, what + " " + std::to_string(count) + " times " + std::to_string(bits) +
                           " bits is not a whole number of int32 words (GPTQ packs " + what +
                           " into full words)");
  return count * bits / 32;
}

// Unsigned b-bit fields of a little-endian stream of 32-bit words (ct_unpack gives u - 2^(b-1)).
std::vector<int64_t> unpack_fields(std::span<const int32_t> words, int64_t count, int bits,
                                   const std::string& where) {
  const auto v = codec::ct_unpack(words, sz(count), bits, codec::CtPackLayout::kDenseStream, where);
  std::vector<int64_t> u(v.size());
  const int64_t half = int64_t{1} << (bits - 1);
  for (size_t i = 0; i < v.size(); ++i)
    u[i] = v[i] + half;
  return u;
}

std::vector<int32_t> pack_fields(std::span<const int64_t> u, int bits, const std::string& where) {
  const int64_t half = int64_t{1} << (bits - 1);
  std::vector<int8_t> v(u.size());
  for (size_t i = 0; i < u.size(); ++i) {
    if (u[i] < 0 || u[i] >= 2 * half)
      throw Error(where, "field " + std::to_string(i) + " = " + std::to_string(u[i]) +
                             " does not fit " + std::to_string(bits) + " unsigned bits");
    v[i] = static_cast<int8_t>(u[i] - half);
  }
  return codec::ct_pack(v, bits, codec::CtPackLayout::kDenseStream, where);
}

int64_t groups_of(const QuantArgs& a, int64_t k, const std::string& where) {
  const int64_t g = pack_quantized_group(a, k, where);
  return k / g;
}

}  // namespace

Matrix group_major_scales(const HostTensor& t, int64_t n, int64_t groups,
                          const std::string& where) {
  const auto sv = decode(t.view(), where);
  require_finite(sv, where);
  if (static_cast<int64_t>(sv.size()) != n * groups)
    throw Error(where, "holds " + std::to_string(sv.size()) + " scales, expected [" +
                           std::to_string(groups) + ", " + std::to_string(n) + "]");
  Matrix m(n, groups);
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t c = 0; c < n; ++c) {
      const double s = sv[sz(g * n + c)];
      if (!(s > 0))
        throw Error(where, "element [" + std::to_string(g) + ", " + std::to_string(c) +
                               "] = " + std::to_string(s) + ": scales must be > 0");
      m(c, g) = s;
    }
  return m;
}

std::vector<ParamSpec> gptq_specs(const QuantArgs& a, int64_t n, int64_t k,
                                  std::vector<DType> scale_dtypes) {
  const int b = a.num_bits;
  const int64_t groups = groups_of(a, k, "gptq");
  return {{"qweight",
           {DType::kI32},
           {words_of(k, b, "in_features", "gptq"), n},
           true,
           "unsigned codes packed along K"},
          {"qzeros",
           {DType::kI32},
           {groups, words_of(n, b, "out_features", "gptq")},
           true,
           "zero points packed along N"},
          {"scales", std::move(scale_dtypes), {groups, n}, true, ""},
          {"g_idx", {DType::kI32}, {k}, a.actorder == ActOrder::kGroup, "group of each column"}};
}

IntWeight decode_gptq(const std::function<const HostTensor*(const std::string&)>& get,
                      const std::function<std::string(const std::string&)>& where,
                      const QuantArgs& a, GptqZeroFormat zf, int64_t n, int64_t k) {
  const auto need = [&](const std::string& name) -> const HostTensor& {
    const HostTensor* t = get(name);
    if (!t) throw Error(where(name), "missing");
    return *t;
  };
  const int b = a.num_bits;
  const int64_t half = int64_t{1} << (b - 1);
  const int64_t gsize = pack_quantized_group(a, k, where("qweight"));
  IntWeight w;
  w.rows = n;
  w.cols = k;
  w.groups = k / gsize;

  // Codes: column n of qweight [K*b/32, N] is a bit stream along K.
  const std::string wq = where("qweight");
  const int64_t kw = words_of(k, b, "in_features", wq);
  const auto words = decode_ints(need("qweight").view(), wq);
  if (static_cast<int64_t>(words.size()) != kw * n)
    throw Error(wq, "holds " + std::to_string(words.size()) + " words, expected [" +
                        std::to_string(kw) + ", " + std::to_string(n) + "]");
  w.q.resize(sz(n * k));
  std::vector<int32_t> col(sz(kw));
  for (int64_t c = 0; c < n; ++c) {
    for (int64_t i = 0; i < kw; ++i)
      col[sz(i)] = static_cast<int32_t>(words[sz(i * n + c)]);
    const auto u = unpack_fields(col, k, b, wq + " column " + std::to_string(c));
    for (int64_t r = 0; r < k; ++r)
      w.q[sz(c * k + r)] = u[sz(r)] - half;
  }

  // Zero points: row g of qzeros [G, N*b/32] is a bit stream along N.
  const std::string wz = where("qzeros");
  const int64_t nw = words_of(n, b, "out_features", wz);
  const auto zw = decode_ints(need("qzeros").view(), wz);
  if (static_cast<int64_t>(zw.size()) != nw * w.groups)
    throw Error(wz, "holds " + std::to_string(zw.size()) + " words, expected [" +
                        std::to_string(w.groups) + ", " + std::to_string(nw) + "]");
  w.zero.assign(sz(n * w.groups), 0);
  std::vector<int32_t> row(sz(nw));
  for (int64_t g = 0; g < w.groups; ++g) {
    for (int64_t i = 0; i < nw; ++i)
      row[sz(i)] = static_cast<int32_t>(zw[sz(g * nw + i)]);
    const auto z = unpack_fields(row, n, b, wz + " row " + std::to_string(g));
    for (int64_t c = 0; c < n; ++c) {
      // v1 stores z - 1 for z in [0, 2^b - 1]: a field of 2^b - 1 is the -1 of z = 0, which
      // AutoGPTQ's unmasked packing also spilled into the fields above it.
      if (zf == GptqZeroFormat::kV1 && z[sz(c)] == 2 * half - 1)
        throw Error(wz, "group " + std::to_string(g) + ", column " + std::to_string(c) +
                            ": stored field " + std::to_string(z[sz(c)]) +
                            " is the z - 1 = -1 of a zero point 0, which checkpoint_format gptq "
                            "cannot store (AutoGPTQ's packing spills it into the neighbouring "
                            "fields): the zero points are corrupt; requantize as gptq_v2");
      const int64_t zu = z[sz(c)] + (zf == GptqZeroFormat::kV1 ? 1 : 0);
      if (a.symmetric && zu != half)
        throw Error(wz, "group " + std::to_string(g) + ", column " + std::to_string(c) +
                            ": zero point " + std::to_string(zu) +
                            (zf == GptqZeroFormat::kV1 ? " (stored + 1)" : "") +
                            " in a sym checkpoint, which stores " + std::to_string(half) +
                            " (vLLM's Marlin path ignores qzeros and uses " + std::to_string(half) +
                            "; its other kernels read them)");
      w.zero[sz(c * w.groups + g)] = zu - half;
    }
  }

  w.scales = group_major_scales(need("scales"), n, w.groups, where("scales"));

  // Groups of the columns.
  w.group.resize(sz(k));
  for (int64_t c = 0; c < k; ++c)
    w.group[sz(c)] = c / gsize;
  if (const HostTensor* gt = get("g_idx")) {
    const std::string wg = where("g_idx");
    const auto gi = decode_ints(gt->view(), wg);
    if (static_cast<int64_t>(gi.size()) != k)
      throw Error(wg, "holds " + std::to_string(gi.size()) + " groups, in_features is " +
                          std::to_string(k));
    // Without desc_act vLLM ignores g_idx: only column order has one meaning then.
    if (a.actorder != ActOrder::kGroup)
      for (int64_t c = 0; c < k; ++c)
        if (gi[sz(c)] != c / gsize)
          throw Error(wg, "element " + std::to_string(c) + " = " + std::to_string(gi[sz(c)]) +
                              " is not column order (" + std::to_string(c / gsize) +
                              ") but desc_act is false: vLLM ignores g_idx then, other readers "
                              "do not, so the checkpoint has no single meaning");
    w.group = checked_g_idx(gi, w.groups, gsize, wg);
  }
  return w;
}

TensorMap encode_gptq(const IntWeight& w, int bits, GptqZeroFormat zf, DType scale_dtype,
                      const std::string& where) {
  const int64_t n = w.rows, k = w.cols, half = int64_t{1} << (bits - 1);
  const int64_t kw = words_of(k, bits, "in_features", where + ".qweight");
  const int64_t nw = words_of(n, bits, "out_features", where + ".qzeros");
  std::vector<int64_t> qweight(sz(kw * n));
  std::vector<int64_t> u(sz(k));
  for (int64_t c = 0; c < n; ++c) {
    for (int64_t r = 0; r < k; ++r)
      u[sz(r)] = w.q[sz(c * k + r)] + half;
    const auto col = pack_fields(u, bits, where + ".qweight column " + std::to_string(c));
    for (int64_t i = 0; i < kw; ++i)
      qweight[sz(i * n + c)] = col[sz(i)];
  }
  std::vector<int64_t> qzeros(sz(w.groups * nw));
  std::vector<int64_t> z(sz(n));
  for (int64_t g = 0; g < w.groups; ++g) {
    for (int64_t c = 0; c < n; ++c) {
      z[sz(c)] = w.zero[sz(c * w.groups + g)] + half - (zf == GptqZeroFormat::kV1 ? 1 : 0);
      if (z[sz(c)] < 0)
        throw Error(where + ".qzeros", "group " + std::to_string(g) + ", column " +
                                           std::to_string(c) +
                                           ": zero point 0 cannot be stored by checkpoint_format "
                                           "gptq (it stores z - 1); write gptq_v2");
    }
    const auto row = pack_fields(z, bits, where + ".qzeros row " + std::to_string(g));
    for (int64_t i = 0; i < nw; ++i)
      qzeros[sz(g * nw + i)] = row[sz(i)];
  }
  std::vector<double> scales(sz(w.groups * n));
  for (int64_t g = 0; g < w.groups; ++g)
    for (int64_t c = 0; c < n; ++c)
      scales[sz(g * n + c)] = w.scales(c, g);
  TensorMap out;
  out["qweight"] = encode_ints(DType::kI32, {kw, n}, qweight, where + ".qweight");
  out["qzeros"] = encode_ints(DType::kI32, {w.groups, nw}, qzeros, where + ".qzeros");
  out["scales"] = encode(scale_dtype, {w.groups, n}, scales, Encoding::kExact, where + ".scales");
  out["g_idx"] = encode_ints(DType::kI32, {k}, w.group, where + ".g_idx");
  return out;
}

IntWeight quantize_gptq_rtn(const Matrix& x, int bits, int64_t group_size, bool symmetric,
                            std::vector<int64_t> group, DType scale_dtype, bool exact,
                            const std::string& where) {
  require_finite(x.data, where);
  const int64_t n = x.rows, k = x.cols, maxq = (int64_t{1} << bits) - 1;
  const int64_t half = int64_t{1} << (bits - 1);
  if (group_size <= 0 || k % group_size != 0)
    throw Error(where, "group_size " + std::to_string(group_size) + " does not divide K " +
                           std::to_string(k));
  if (group.empty()) {
    group.resize(sz(k));
    for (int64_t c = 0; c < k; ++c)
      group[sz(c)] = c / group_size;
  }
  const Arith a = exact ? Arith::kFp64 : Arith::kFp32;
  const Arith store = arith_of(scale_dtype, where);
  IntWeight w;
  w.rows = n;
  w.cols = k;
  w.groups = k / group_size;
  w.group = group;
  w.q.resize(sz(n * k));
  w.zero.assign(sz(n * w.groups), 0);
  w.scales = Matrix(n, w.groups);
  std::vector<double> lo(sz(w.groups)), hi(sz(w.groups));
  for (int64_t r = 0; r < n; ++r) {
    std::fill(lo.begin(), lo.end(), 0.0);
    std::fill(hi.begin(), hi.end(), 0.0);
    for (int64_t c = 0; c < k; ++c) {
      // The producer sees its fp32 copy of the weight (W.float(): exact for bf16 / fp16 models).
      const double v = in(a, x(r, c));
      const size_t g = sz(group[sz(c)]);
      lo[g] = std::min(lo[g], v);
      hi[g] = std::max(hi[g], v);
    }
    for (int64_t g = 0; g < w.groups; ++g) {
      double xmin = lo[sz(g)], xmax = hi[sz(g)];
      if (symmetric) {
        xmax = std::max(-xmin, xmax);
        if (xmin < 0) xmin = -xmax;
      }
      if (xmin == 0 && xmax == 0) {
        xmin = -1;
        xmax = 1;
      }
      const double s = div_in(a, sub_in(a, xmax, xmin), static_cast<double>(maxq));
      const int64_t zu =
          symmetric
              ? half
              : static_cast<int64_t>(exact ? int_of_quotient(-xmin, 1.0, s)
                                           : round_int(div_in(a, -xmin, s), IntRound::kHalfEven));
      const double stored = in(store, s);
      if (!(stored > 0) || !std::isfinite(stored))
        throw Error(where, "row " + std::to_string(r) + ", group " + std::to_string(g) +
                               ": scale " + std::to_string(s) + " is not a positive finite " +
                               std::string(dtype_name(scale_dtype)) + " value");
      w.scales(r, g) = stored;
      w.zero[sz(r * w.groups + g)] = std::clamp<int64_t>(zu, 0, maxq) - half;
    }
    for (int64_t c = 0; c < k; ++c) {
      const int64_t g = group[sz(c)];
      const double s = w.scales(r, g);
      const double t = exact ? int_of_quotient(x(r, c), 1.0, s)
                             : round_int(div_in(a, x(r, c), s), IntRound::kHalfEven);
      const int64_t zu = w.zero[sz(r * w.groups + g)] + half;
      w.q[sz(r * k + c)] = std::clamp<int64_t>(static_cast<int64_t>(t) + zu, 0, maxq) - half;
    }
  }
  return w;
}

}  // namespace qparity::reference
