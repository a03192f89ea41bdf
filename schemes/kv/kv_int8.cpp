#include "schemes/kv/kv_int8.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace qparity::reference {

namespace {
const char* proj(KvWhich w) {
  return w == KvWhich::kKey ? "k_proj" : "v_proj";
}
size_t idx(KvWhich w) {
  return w == KvWhich::kKey ? 0 : 1;
}
}  // namespace

KvInt8Rules kv_int8_rules(Dialect d) {
  KvInt8Rules r;
  r.producer = ms_int_rules(d);
  if (d == Dialect::kIdeal) {
    r.store_use = ScaleUse::kDivide;
    r.store_arith = Arith::kFp64;
  } else {
    r.store_use = ScaleUse::kMultiplyReciprocal;
    r.store_arith = Arith::kFp32;
  }
  r.store_round = IntRound::kHalfEven;
  return r;
}

TensorMap quantize_kv_int8(const KvInt8Request& req) {
  const KvInt8Rules rules = kv_int8_rules(req.dialect);
  TensorMap out;
  for (const KvWhich w : {KvWhich::kKey, KvWhich::kValue}) {
    const Matrix& m = w == KvWhich::kKey ? req.keys : req.values;
    const std::string name = std::string(proj(w));
    if (m.rows <= 0 || m.cols <= 0)
      throw Error(req.where,
                  "quantize_kv_int8 needs calibration " + std::string(to_string(w)) + " rows");
    require_finite(m.data, req.where + " " + std::string(to_string(w)) + "s");
    if (m.cols != req.keys.cols)
      throw Error(req.where, "keys and values have different channel counts");
    std::vector<double> sc(static_cast<size_t>(m.cols)), of(sc.size());
    for (int64_t c = 0; c < m.cols; ++c) {
      double mn = m(0, c), mx = mn;
      for (int64_t t = 0; t < m.rows; ++t) {
        mn = std::min(mn, m(t, c));
        mx = std::max(mx, m(t, c));
      }
      const MsIntQParams p = ms_int_qparams(mn, mx, req.symmetric, rules.producer);
      sc[static_cast<size_t>(c)] = p.scale;
      of[static_cast<size_t>(c)] = p.offset;
    }
    out[name + ".kv_cache_scale"] =
        encode(DType::kF32, {m.cols}, sc, Encoding::kExact, req.where + "." + name + ".scale");
    out[name + ".kv_cache_offset"] =
        encode(DType::kF32, {m.cols}, of, Encoding::kExact, req.where + "." + name + ".offset");
  }
  return out;
}

KvInt8CacheMethod::KvInt8CacheMethod(KvShape shape, MethodConfig config)
    : KvCacheMethod(std::move(shape), std::move(config)) {
  if (this->config().scheme.kind != SchemeKind::kKvInt8)
    throw Error(this->shape().prefix,
                "KvInt8CacheMethod built for scheme " + to_string(this->config().scheme));
  rules_ = kv_int8_rules(this->config().dialect);
}

std::vector<ParamSpec> KvInt8CacheMethod::create_weights() const {
  const int64_t c = shape().channels();
  const std::vector<DType> fl = {DType::kF32, DType::kF16, DType::kBF16};
  std::vector<ParamSpec> v;
  for (const char* p : {"k_proj", "v_proj"}) {
    v.push_back({std::string(p) + ".kv_cache_scale", fl, {c}, true, "per channel (head·D + d)"});
    v.push_back({std::string(p) + ".kv_cache_offset", fl, {c}, true, "integral; zeros if sym"});
  }
  return v;
}

void KvInt8CacheMethod::process() {
  for (const KvWhich w : {KvWhich::kKey, KvWhich::kValue}) {
    const std::string sn = std::string(proj(w)) + ".kv_cache_scale";
    const std::string on = std::string(proj(w)) + ".kv_cache_offset";
    auto sc = decode(loaded(sn).view(), where(sn));
    auto of = decode(loaded(on).view(), where(on));
    for (size_t i = 0; i < sc.size(); ++i)
      if (!std::isfinite(sc[i]) || !(sc[i] > 0.0))
        throw Error(where(sn), "scale " + std::to_string(sc[i]) + " at channel " +
                                   std::to_string(i) + " (scales must be finite and > 0)");
    for (size_t i = 0; i < of.size(); ++i)
      if (!std::isfinite(of[i]) || of[i] != std::floor(of[i]) || of[i] < -128.0 || of[i] > 127.0)
        throw Error(where(on), "offset " + std::to_string(of[i]) + " at channel " +
                                   std::to_string(i) +
                                   " must be an integer in [-128, 127] (the NPU uses it as int8)");
    scale_[idx(w)] = std::move(sc);
    offset_[idx(w)] = std::move(of);
  }
}

const std::vector<double>& KvInt8CacheMethod::scales(KvWhich w) const {
  return scale_[idx(w)];
}
const std::vector<double>& KvInt8CacheMethod::offsets(KvWhich w) const {
  return offset_[idx(w)];
}

QuantizedMatrix KvInt8CacheMethod::do_store(KvWhich which, const Matrix& x) const {
  const auto& sc = scale_[idx(which)];
  const auto& of = offset_[idx(which)];
  QuantizedMatrix q;
  q.rows = x.rows;
  q.cols = x.cols;
  q.lattice = 1.0;
  q.block_rows = std::max<int64_t>(x.rows, 1);
  q.block_cols = 1;
  q.scales = Matrix(x.rows > 0 ? 1 : 0, x.cols);
  if (x.rows > 0) std::copy(sc.begin(), sc.end(), q.scales.data.begin());
  q.codes.resize(x.data.size());
  const MsIntRules r{rules_.store_arith, rules_.store_round};
  for (int64_t t = 0; t < x.rows; ++t)
    for (int64_t c = 0; c < x.cols; ++c) {
      const MsIntQParams p{sc[static_cast<size_t>(c)], of[static_cast<size_t>(c)]};
      q.codes[static_cast<size_t>(t * x.cols + c)] =
          ms_int_quantize(x(t, c), p, r, rules_.store_use);
    }
  return q;
}

Matrix KvInt8CacheMethod::do_read(KvWhich which, const QuantizedMatrix& stored) const {
  validate(stored, "kv-int8 read");
  const auto& sc = scale_[idx(which)];
  const auto& of = offset_[idx(which)];
  Matrix out(stored.rows, stored.cols);
  for (int64_t t = 0; t < stored.rows; ++t)
    for (int64_t c = 0; c < stored.cols; ++c) {
      const int64_t q = stored.code(t, c);
      if (q < -128 || q > 127 || stored.lattice != 1.0)
        throw Error(where(std::string(proj(which)) + ".kv_cache_scale"),
                    "stored code " + std::to_string(q) + " at (" + std::to_string(t) + ", " +
                        std::to_string(c) + ") is not an int8 cache entry");
      out(t, c) = ms_int_dequantize(q, {sc[static_cast<size_t>(c)], of[static_cast<size_t>(c)]});
    }
  return out;
}

std::unique_ptr<KvCacheMethod> make_kv_int8_method(KvShape shape, MethodConfig config) {
  return std::make_unique<KvInt8CacheMethod>(std::move(shape), std::move(config));
}

}  // namespace qparity::reference
