#include "schemes/int/w8a16.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace qparity::reference {

W8A16Rules w8a16_rules(Dialect d) {
  return {ms_int_rules(d)};
}

TensorMap quantize_w8a16(const QuantizeRequest& req) {
  const Matrix& w = req.weight;
  const int64_t n = w.rows, k = w.cols;
  if (n <= 0 || k <= 0) throw Error(req.where, "w8a16 needs a non-empty weight");
  require_finite(w.data, req.where);
  const int64_t g = req.group_size == 0 ? k : req.group_size;
  if (g <= 0 || k % g != 0)
    throw Error(req.where, "w8a16 group size " + std::to_string(req.group_size) +
                               " must divide in_features K = " + std::to_string(k));
  if (req.weights && (req.weights->num_bits != 8 || req.weights->type != QuantType::kInt))
    throw Error(req.where,
                "w8a16 quantizes to 8-bit integers (args say " + describe(*req.weights) + ")");
  const bool symmetric = req.weights ? req.weights->symmetric : true;
  const MsIntRules rules = w8a16_rules(req.dialect).qparams;
  const int64_t ng = k / g;
  std::vector<int64_t> codes(static_cast<size_t>(n * k));
  std::vector<double> scales(static_cast<size_t>(n * ng)), offsets(scales.size());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < ng; ++j) {
      double mn = w(r, j * g), mx = mn;
      for (int64_t c = j * g; c < (j + 1) * g; ++c) {
        mn = std::min(mn, w(r, c));
        mx = std::max(mx, w(r, c));
      }
      const MsIntQParams p = ms_int_qparams(mn, mx, symmetric, rules);
      scales[static_cast<size_t>(r * ng + j)] = p.scale;
      offsets[static_cast<size_t>(r * ng + j)] = p.offset;
      for (int64_t c = j * g; c < (j + 1) * g; ++c)
        codes[static_cast<size_t>(r * k + c)] = ms_int_quantize(w(r, c), p, rules);
    }
  TensorMap out;
  out["weight"] = encode_ints(DType::kI8, {n, k}, codes, req.where);
  out["weight_scale"] =
      encode(DType::kF32, {n, ng}, scales, Encoding::kExact, req.where + "_scale");
  out["weight_offset"] =
      encode(DType::kF32, {n, ng}, offsets, Encoding::kExact, req.where + "_offset");
  add_bias(out, req, DType::kF32);  // msModelSlim writes biases as FLOAT
  return out;
}

Matrix dequantize_w8a16(const TensorMap& t, const std::string& where) {
  const auto find = [&](const std::string& name) -> const HostTensor& {
    return tensor_in(t, name, where);
  };
  const HostTensor& wt = find("weight");
  if (wt.shape.size() != 2) throw Error(where + ".weight", "expected [N, K]");
  const int64_t n = wt.shape[0], k = wt.shape[1];
  const auto q = decode_ints(wt.view(), where + ".weight");
  const auto s = decode(find("weight_scale").view(), where + ".weight_scale");
  const auto o = decode(find("weight_offset").view(), where + ".weight_offset");
  if (s.size() != o.size() || s.empty() || s.size() % static_cast<size_t>(n) != 0)
    throw Error(where + ".weight_scale", "scale/offset shapes do not match the weight");
  const int64_t ng = static_cast<int64_t>(s.size()) / n;
  if (k % ng != 0) throw Error(where + ".weight_scale", "groups do not divide K");
  const int64_t g = k / ng;
  const double shift = wt.dtype == DType::kU8 ? 128.0 : 0.0;
  Matrix out(n, k);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) {
      const size_t si = static_cast<size_t>(r * ng + c / g);
      out(r, c) =
          ((static_cast<double>(q[static_cast<size_t>(r * k + c)]) - shift) - (o[si] - shift)) *
          s[si];
    }
  return out;
}

W8A16LinearMethod::W8A16LinearMethod(LinearShape shape, MethodConfig config)
    : LinearMethod(std::move(shape), std::move(config)) {
  const auto& s = this->shape();
  const SchemeId id = this->config().scheme;
  if (id.kind == SchemeKind::kW8A16Channel)
    group_ = s.in_features;
  else if (id.kind == SchemeKind::kW8A16Group)
    group_ = id.group_size;
  else
    throw Error(s.prefix, "W8A16LinearMethod built for scheme " + to_string(id));
  if (group_ <= 0 || s.in_features % group_ != 0)
    throw Error(s.prefix, to_string(id) +
                              " needs in_features (K = " + std::to_string(s.in_features) +
                              ") divisible by " + std::to_string(group_));
}

std::vector<ParamSpec> W8A16LinearMethod::create_weights(int64_t partition) const {
  const auto& s = shape();
  const int64_t n = s.partitions.at(static_cast<size_t>(partition));
  const int64_t ng = s.in_features / group_;
  const std::vector<DType> fl = {DType::kF32, DType::kF16, DType::kBF16};
  return {{"weight",
           {DType::kI8, DType::kU8},
           {n, s.in_features},
           true,
           "int8 codes; U8 = unsigned checkpoint, 128 subtracted from weight and offset"},
          {"weight_scale",
           fl,
           {n, ng},
           true,
           "[N,1] per channel, [N,K/G] per group",
           ng == 1 ? std::vector<std::vector<int64_t>>{{n}} : std::vector<std::vector<int64_t>>{}},
          {"weight_offset",
           fl,
           {n, ng},
           true,
           "zeros when symmetric; (q - offset)·scale",
           ng == 1 ? std::vector<std::vector<int64_t>>{{n}} : std::vector<std::vector<int64_t>>{}},
          bias_spec(s, partition)};
}

void W8A16LinearMethod::process() {
  const auto& s = shape();
  const int64_t k = s.in_features, n_all = s.out_features(), ng = k / group_;
  for (int64_t e = 0; e < s.expert_count(); ++e) {
    Expert ex;
    QuantizedMatrix& m = ex.weight;
    m.rows = n_all;
    m.cols = k;
    m.lattice = 1.0;
    m.block_rows = 1;
    m.block_cols = group_;
    m.scales = Matrix(n_all, ng);
    m.codes.resize(static_cast<size_t>(n_all * k));
    ex.offsets = Matrix(n_all, ng);
    for (int64_t p = 0; p < s.partition_count(); ++p) {
      const int64_t row0 = s.partition_offset(p);
      const int64_t n = s.partitions[static_cast<size_t>(p)];
      const HostTensor& wt = loaded("weight", p, e);
      const bool unsigned_w = wt.dtype == DType::kU8;
      const auto q = decode_ints(wt.view(), where("weight", p, e));
      const auto sc = decode(loaded("weight_scale", p, e).view(), where("weight_scale", p, e));
      const auto of = decode(loaded("weight_offset", p, e).view(), where("weight_offset", p, e));
      for (size_t i = 0; i < sc.size(); ++i)
        if (!std::isfinite(sc[i]) || !(sc[i] > 0.0))
          throw Error(where("weight_scale", p, e), "scale " + std::to_string(sc[i]) +
                                                       " at element " + std::to_string(i) +
                                                       " (scales must be finite and > 0)");
      require_finite(of, where("weight_offset", p, e));
      const int64_t shift = unsigned_w ? 128 : 0;
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t c = 0; c < k; ++c)
          m.codes[static_cast<size_t>((row0 + r) * k + c)] =
              q[static_cast<size_t>(r * k + c)] - shift;
        for (int64_t j = 0; j < ng; ++j) {
          const size_t i = static_cast<size_t>(r * ng + j);
          if (unsigned_w && (of[i] < 0.0 || of[i] > 255.0))
            throw Error(where("weight_offset", p, e),
                        "offset " + std::to_string(of[i]) + " at element " + std::to_string(i) +
                            " of an unsigned (U8) weight must be an unsigned zero point in "
                            "[0, 255]");
          m.scales(row0 + r, j) = sc[i];
          ex.offsets(row0 + r, j) = of[i] - static_cast<double>(shift);
          if (of[i] != std::floor(of[i]) || std::fabs(of[i]) > 1e15) ex.integral_offsets = false;
        }
      }
    }
    if (ex.integral_offsets) {
      m.zero_points.resize(ex.offsets.data.size());
      for (size_t i = 0; i < m.zero_points.size(); ++i)
        m.zero_points[i] = static_cast<int64_t>(ex.offsets.data[i]);
    }
    m.compact();
    ex.bias = loaded_bias(e);
    experts_.push_back(std::move(ex));
  }
}

void W8A16LinearMethod::Expert::dequantized_row(int64_t r, int64_t c0,
                                                std::span<double> out) const {
  const int64_t g = weight.block_cols;
  // With integral offsets the matrix's codes are q - offset already (exact integers); otherwise it
  // holds no zero points, its codes are q, and q - offset rounds here as the file's formula does.
  weight.row_codes_as_doubles(r, c0, out);
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t c = c0 + static_cast<int64_t>(i);
    const double q_minus_offset = integral_offsets ? out[i] : out[i] - offsets(r, c / g);
    out[i] = q_minus_offset * weight.scales(r, c / g);
  }
}

Matrix W8A16LinearMethod::do_apply(const Matrix& x, int64_t expert) const {
  const Expert& ex = experts_[static_cast<size_t>(expert)];
  Matrix y =
      ex.integral_offsets
          ? weight_only_gemm(x, ex.weight)
          : matmul_nt_rows(x, ex.weight.rows, [&](int64_t r, int64_t c0, std::span<double> out) {
              ex.dequantized_row(r, c0, out);
            });
  for (int64_t t = 0; t < y.rows; ++t)
    for (int64_t n = 0; n < y.cols; ++n)
      y(t, n) += ex.bias[static_cast<size_t>(n)];
  return y;
}

Matrix W8A16LinearMethod::do_dequantized_weight(int64_t expert) const {
  const Expert& ex = experts_[static_cast<size_t>(expert)];
  Matrix w(ex.weight.rows, ex.weight.cols);
  for (int64_t r = 0; r < w.rows; ++r)
    ex.dequantized_row(r, 0, w.row(r));
  return w;
}

std::optional<ProcessedIntWeight> W8A16LinearMethod::processed_int_weight(int64_t expert) const {
  const Expert& ex = experts_.at(static_cast<size_t>(expert));
  ProcessedIntWeight w = int_weight_of(ex.weight, group_, 8, IntCodes::kStored);
  // With integral offsets the matrix's zero points are the offsets and stored() is q; otherwise
  // stored() is q and the offsets live beside it. Either way w = (q - offset) * s.
  w.zero = ex.offsets.data;
  w.scale = ex.weight.scales.data;
  if (std::any_of(ex.bias.begin(), ex.bias.end(), [](double b) { return b != 0.0; }))
    w.bias = ex.bias;
  return w;
}

TensorMap W8A16LinearMethod::runtime_tensors() const {
  const auto& s = shape();
  const int64_t n = s.out_features(), k = s.in_features, ng = k / group_;
  const bool stack = s.num_experts > 0;
  const std::string pre = !stack ? "" : (s.partition_count() == 2 ? "w13_" : "w2_");
  std::vector<int64_t> codes;
  std::vector<double> scales, offsets;
  for (const Expert& ex : experts_) {
    std::vector<int64_t> q(static_cast<size_t>(k));
    for (int64_t r = 0; r < ex.weight.rows; ++r) {
      ex.weight.stored_row(r, q);
      codes.insert(codes.end(), q.begin(), q.end());
    }
    scales.insert(scales.end(), ex.weight.scales.data.begin(), ex.weight.scales.data.end());
    // NPU convention (q + off_rt)·s: off_rt = -offset (MindIE registers -(weight_offset)).
    for (double v : ex.offsets.data)
      offsets.push_back(-v);
  }
  auto shp = [&](std::vector<int64_t> d) {
    if (stack) d.insert(d.begin(), s.num_experts);
    return d;
  };
  TensorMap out;
  out[pre + "weight"] = encode_ints(DType::kI8, shp({n, k}), codes, s.prefix + " runtime weight");
  out[pre + "weight_scale"] =
      encode(DType::kF64, shp({n, ng}), scales, Encoding::kExact, s.prefix + " runtime scale");
  out[pre + "weight_offset"] =
      encode(DType::kF64, shp({n, ng}), offsets, Encoding::kExact, s.prefix + " runtime offset");
  return out;
}

std::unique_ptr<LinearMethod> make_w8a16_method(LinearShape shape, MethodConfig config) {
  return std::make_unique<W8A16LinearMethod>(std::move(shape), std::move(config));
}

}  // namespace qparity::reference
