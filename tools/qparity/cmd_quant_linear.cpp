// `qparity quant-linear --scheme ID [--dialect D] --in IN.safetensors --out OUT.safetensors`:
// one linear layer through the fp64 reference, for checking an engine or a producer tensor by
// tensor. IN holds `weight` [N, K] (any float dtype), optionally `bias` [N], `x` [T, K]
// (activations to run) and `calib` [C, K] (calibration activations for static-activation
// schemes; `x` is used when absent). OUT receives the tensors the scheme's producer writes, under
// the producer's names, plus, in fp64:
//   qparity.dequantized [N, K]   the weight the layer multiplies with
//   qparity.y           [T, N]   apply(x)                                  (with x)
//   qparity.x_values    [T, K]   the quantized activations' values         (activation schemes)
//   qparity.x_scales    [R, C]   their scale grid (per token, per group...) (activation schemes)
// and metadata {scheme, dialect, model_dtype}. An existing OUT is kept unless --force.
#include <iostream>
#include <memory>

#include "core/error.h"
#include "core/safetensors/safetensors_file.h"
#include "core/safetensors/safetensors_writer.h"
#include "schemes/description/scheme_registry.h"
#include "schemes/math/numeric.h"
#include "schemes/method/method_factory.h"
#include "schemes/method/tensor_decode.h"
#include "tools/qparity/cli_support.h"
#include "tools/qparity/commands.h"

namespace qparity::cli {

namespace {

using namespace qparity::reference;

struct QuantLinearOptions {
  std::string scheme;
  std::string dialect = "ideal";
  std::string in;
  std::string out;
  std::string model_dtype = "BF16";
  bool weight_only = false;
  bool force = false;
};

Matrix read_matrix(const SafetensorsFile& f, const std::string& name, int64_t cols) {
  const TensorInfo& t = f.at(name);
  const std::string where = f.path().string() + ": tensor '" + name + "'";
  if (t.shape.size() != 2) throw Error(where, "must be 2-D");
  if (cols >= 0 && static_cast<int64_t>(t.shape[1]) != cols)
    throw Error(where, "has " + std::to_string(t.shape[1]) + " columns, the weight has " +
                           std::to_string(cols));
  Matrix m(static_cast<int64_t>(t.shape[0]), static_cast<int64_t>(t.shape[1]));
  m.data = reference::decode_all(t.dtype, f.bytes(t), t.numel(), where);
  require_finite(m.data, where);
  return m;
}

HostTensor f64_tensor(const Matrix& m) {
  return encode(DType::kF64, {m.rows, m.cols}, m.data, Encoding::kExact, "output");
}

void run(const QuantLinearOptions& o) {
  const SchemeId scheme = parse_scheme_id(o.scheme);
  const Dialect dialect = parse_dialect(o.dialect);
  const auto model_dtype = dtype_from_name(o.model_dtype);
  if (!model_dtype) throw Error("--model-dtype", "unknown dtype '" + o.model_dtype + "'");
  arith_of(*model_dtype, "--model-dtype");

  const SafetensorsFile in = SafetensorsFile::open(o.in);
  QuantizeRequest req;
  req.weight = read_matrix(in, "weight", -1);
  req.model_dtype = *model_dtype;
  req.dialect = dialect;
  req.where = o.in + ": weight";
  if (scheme.kind == SchemeKind::kW8A16Group) req.group_size = scheme.group_size;
  const int64_t n = req.weight.rows, k = req.weight.cols;
  if (const TensorInfo* b = in.find("bias")) {
    if (b->shape.size() != 1 || static_cast<int64_t>(b->shape[0]) != n)
      throw Error(o.in + ": tensor 'bias'", "must have shape [" + std::to_string(n) + "]");
    req.bias = reference::decode_all(b->dtype, in.bytes(*b), b->numel(), o.in + ": bias");
  }
  std::optional<Matrix> x;
  if (in.find("x")) x = read_matrix(in, "x", k);
  const Matrix* calib = nullptr;
  std::optional<Matrix> calib_m;
  if (in.find("calib")) {
    calib_m = read_matrix(in, "calib", k);
    calib = &*calib_m;
  } else if (x) {
    calib = &*x;
  }
  if (calib && calib->rows > 0) {
    ActivationStats s;
    s.min = s.max = calib->data[0];
    s.channel_absmax.assign(static_cast<size_t>(k), 0.0);
    for (int64_t r = 0; r < calib->rows; ++r)
      for (int64_t c = 0; c < k; ++c) {
        const double v = (*calib)(r, c);
        s.min = std::min(s.min, v);
        s.max = std::max(s.max, v);
        auto& a = s.channel_absmax[static_cast<size_t>(c)];
        a = std::max(a, std::fabs(v));
      }
    req.activations = s;
  }

  MethodConfig cfg = method_config(scheme, dialect);
  if (o.weight_only) cfg.input_activations.reset();
  req.weights = cfg.weights;
  req.input_activations = cfg.input_activations;
  const TensorMap tensors = quantize_linear(scheme, req);

  auto method = make_linear_method(
      LinearShape::dense("", n, k, *model_dtype, tensors.count("bias") > 0), cfg);
  method->load_all(tensors);
  method->process_weights_after_loading();

  TensorMap extra;
  extra["qparity.dequantized"] = f64_tensor(method->dequantized_weight());
  if (x) {
    extra["qparity.y"] = f64_tensor(method->apply(*x));
    if (const auto q = method->quantize_input(*x)) {
      Matrix values(q->rows, q->cols);  // codes on their lattice, before the scales
      std::vector<int64_t> row(static_cast<size_t>(q->cols));
      for (int64_t t = 0; t < q->rows; ++t) {
        q->row_codes(t, row);
        for (int64_t c = 0; c < q->cols; ++c)
          values(t, c) = static_cast<double>(row[static_cast<size_t>(c)]) * q->lattice;
      }
      extra["qparity.x_values"] = f64_tensor(values);
      extra["qparity.x_scales"] = f64_tensor(q->scales);
    }
  }
  std::vector<TensorToWrite> out;
  const TensorMap& extra_view = extra;
  for (const TensorMap* m : {&tensors, &extra_view})
    for (const auto& [name, t] : *m) {
      std::vector<uint64_t> shape(t.shape.begin(), t.shape.end());
      out.push_back(TensorToWrite{name, t.dtype, shape, std::span<const uint8_t>(t.bytes)});
    }
  std::map<std::string, std::string> meta = {{"scheme", to_string(scheme)},
                                             {"dialect", std::string(to_string(dialect))},
                                             {"model_dtype", o.model_dtype},
                                             {"producer", "qparity quant-linear"}};
  write_safetensors(o.out, std::move(out), meta,
                    o.force ? OverwritePolicy::kReplace : OverwritePolicy::kRefuse);
  std::cerr << "qparity: " << to_string(scheme) << " (" << to_string(dialect)
            << "): " << tensors.size() << " tensors -> " << o.out << "\n";
}

}  // namespace

void add_quant_linear_command(CLI::App& app, int& rc) {
  auto o = std::make_shared<QuantLinearOptions>();
  auto* cmd = app.add_subcommand(
      "quant-linear",
      "Quantize one linear weight with a scheme and dialect; write the producer's tensors, the "
      "dequantized weight and, given activations, the layer output");
  cmd->add_option("--scheme", o->scheme, "Scheme id (see `qparity schemes`)")->required();
  cmd->add_option("--dialect", o->dialect,
                  "ideal | compressed-tensors | vllm | sglang | msmodelslim")
      ->capture_default_str()
      ->check(dialect_choices());
  cmd->add_option("--in", o->in, "safetensors with weight [N,K], optional bias, x, calib")
      ->required();
  cmd->add_option("--out", o->out, "safetensors to write")->required();
  cmd->add_option("--model-dtype", o->model_dtype, "dtype of the float checkpoint (scale dtype)")
      ->capture_default_str();
  cmd->add_flag("--weight-only", o->weight_only,
                "drop activation quantization (NVFP4A16, MXFP4A16, MXFP8A16 style)");
  cmd->add_flag("--force", o->force, "replace an existing output file");
  cmd->callback([o, &rc] {
    run(*o);
    rc = 0;
  });
}

}  // namespace qparity::cli
