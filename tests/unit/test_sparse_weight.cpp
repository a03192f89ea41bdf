// compressed-tensors' sparse weight storage (sparse-24-bitmask, sparse-bitmask): the codec on
// hand-made bytes (numpy packbits bitorder little, the compressors' row-major value order), its
// rules as errors, and the whole path: quantize --sparsity writes what the reference loader
// decompresses into exactly the weight of the pruned model.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/safetensors/checkpoint.h"
#include "core/safetensors/safetensors_writer.h"
#include "fixtures/checkpoint_quantizer.h"
#include "fixtures/fixture_model.h"
#include "reference_cpu/models/model_loader.h"
#include "schemes/description/compressed_tensors_config.h"
#include "schemes/method/method_factory.h"
#include "schemes/method/sparse_weight.h"
#include "schemes/method/tensor_decode.h"

namespace qparity::reference {
namespace {

namespace fs = std::filesystem;

HostTensor bf16(std::vector<int64_t> shape, const std::vector<double>& v) {
  return encode(DType::kBF16, std::move(shape), v, Encoding::kExact, "test");
}

std::map<std::string, TensorView> views(const TensorMap& m) {
  std::map<std::string, TensorView> out;
  for (const auto& [k, t] : m)
    out[k] = t.view();
  return out;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Sparse24Bitmask, BytesAreTheCompressorsOwn) {
  // Row 0 keeps columns 1, 3 | 4, 7; row 1 is all zero: the first two of each group are kept.
  const HostTensor dense = bf16({2, 8}, {0, 1.5, 0, -2, 3, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0});
  const TensorMap parts = compress_sparse_weight("sparse-24-bitmask", dense.view(), "w");
  ASSERT_EQ(parts.size(), 3u);
  const HostTensor& mask = parts.at("bitmask");
  EXPECT_EQ(mask.dtype, DType::kU8);
  EXPECT_EQ(mask.shape, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(mask.bytes, (std::vector<uint8_t>{0x9A, 0x33}));  // bits 1,3,4,7 and 0,1,4,5
  const HostTensor& values = parts.at("compressed");
  EXPECT_EQ(values.shape, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(decode(values.view(), "v"), (std::vector<double>{1.5, -2, 3, 4, 0, 0, 0, 0}));
  const HostTensor& shape = parts.at("shape");
  EXPECT_EQ(shape.dtype, DType::kI64);
  EXPECT_EQ(shape.shape, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(decode_ints(shape.view(), "s"), (std::vector<int64_t>{2, 8}));
  const HostTensor back = decompress_sparse_weight("sparse-24-bitmask", views(parts), "w");
  EXPECT_EQ(back.dtype, DType::kBF16);
  EXPECT_EQ(back.shape, dense.shape);
  EXPECT_EQ(back.bytes, dense.bytes);
}

TEST(Sparse24Bitmask, RandomTensorsRoundTripBitForBitInEveryDtype) {
  std::mt19937_64 rng(7);
  for (DType d : {DType::kBF16, DType::kF16, DType::kF32, DType::kI8, DType::kF8E4M3}) {
    const int64_t n = 5, k = 24;  // 24 columns: 3 mask bytes, the last one full
    HostTensor t;
    t.dtype = d;
    t.shape = {n, k};
    const size_t eb = dtype_bits(d) / 8;
    t.bytes.resize(static_cast<size_t>(n * k) * eb);
    for (uint8_t& b : t.bytes)
      b = static_cast<uint8_t>(rng());
    // Zero 2 of every 4 (any 2: the compressor's choice among zeros must not matter).
    for (int64_t e = 0; e < n * k; e += 4) {
      const int a = static_cast<int>(rng() % 4), b = (a + 1 + static_cast<int>(rng() % 3)) % 4;
      std::memset(t.bytes.data() + static_cast<size_t>(e + a) * eb, 0, eb);
      std::memset(t.bytes.data() + static_cast<size_t>(e + b) * eb, 0, eb);
    }
    const TensorMap parts = compress_sparse_weight("sparse-24-bitmask", t.view(), "w");
    EXPECT_EQ(decompress_sparse_weight("sparse-24-bitmask", views(parts), "w").bytes, t.bytes)
        << dtype_name(d);
    const TensorMap u = compress_sparse_weight("sparse-bitmask", t.view(), "w");
    EXPECT_EQ(decompress_sparse_weight("sparse-bitmask", views(u), "w").bytes, t.bytes)
        << dtype_name(d);
  }
}

TEST(Sparse24Bitmask, FloatNegativeZeroIsAZero) {
  // fp8 -0 (0x80) next to two nonzero codes: a zero to the compressor (torch `!= 0`).
  HostTensor t;
  t.dtype = DType::kF8E4M3;
  t.shape = {1, 4};
  t.bytes = {0x38, 0x80, 0x00, 0xB8};
  const TensorMap parts = compress_sparse_weight("sparse-24-bitmask", t.view(), "w");
  EXPECT_EQ(parts.at("bitmask").bytes, (std::vector<uint8_t>{0x09}));
}

TEST(Sparse24Bitmask, EveryRuleIsAnErrorNamingTheTensor) {
  const HostTensor dense = bf16({2, 8}, {0, 1.5, 0, -2, 3, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0});
  const TensorMap good = compress_sparse_weight("sparse-24-bitmask", dense.view(), "w");
  auto with = [&](const std::string& name, HostTensor t) {
    TensorMap m = good;
    m[name] = std::move(t);
    return m;
  };
  // A third bit in row 0's first group.
  HostTensor mask = good.at("bitmask");
  mask.bytes[0] |= 0x01;
  EXPECT_NE(error_of([&] {
              decompress_sparse_weight("sparse-24-bitmask", views(with("bitmask", mask)), "m");
            }).find("m.bitmask: row 0, columns 0..3: 3 bits set"),
            std::string::npos);
  // The values of 3 of every 4.
  EXPECT_NE(error_of([&] {
              decompress_sparse_weight(
                  "sparse-24-bitmask",
                  views(with("compressed", bf16({2, 6}, std::vector<double>(12, 1.0)))), "m");
            }).find("m.compressed: expected shape [2, 4]"),
            std::string::npos);
  // A shape that disagrees with the mask.
  EXPECT_NE(error_of([&] {
              decompress_sparse_weight(
                  "sparse-24-bitmask",
                  views(with("shape",
                             encode_ints(DType::kI64, {2, 1}, std::vector<int64_t>{2, 16}, "s"))),
                  "m");
            }).find("m.bitmask: expected shape [2, 2]"),
            std::string::npos);
  // A part missing, or one no format has.
  TensorMap missing = good;
  missing.erase("bitmask");
  EXPECT_NE(error_of([&] {
              decompress_sparse_weight("sparse-24-bitmask", views(missing), "m");
            }).find("m.bitmask: missing"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              decompress_sparse_weight("sparse-24-bitmask",
                                       views(with("row_offsets", good.at("shape"))), "m");
            }).find("m.row_offsets: not a tensor of the sparse-24-bitmask format"),
            std::string::npos);
  // The writer refuses a weight that is not 2:4 already.
  EXPECT_NE(error_of([&] {
              compress_sparse_weight("sparse-24-bitmask", bf16({1, 4}, {1, 2, 3, 0}).view(), "w");
            }).find("hold 3 nonzero weights"),
            std::string::npos);
}

TEST(SparseBitmask, RowOffsetsAndStoredZerosAreChecked) {
  const HostTensor dense = bf16({2, 4}, {0, 1, 2, 0, 3, 0, 0, 0});
  const TensorMap good = compress_sparse_weight("sparse-bitmask", dense.view(), "w");
  EXPECT_EQ(good.at("compressed").shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(decode_ints(good.at("row_offsets").view(), "r"), (std::vector<int64_t>{0, 2}));
  TensorMap bad = good;
  bad["row_offsets"] = encode_ints(DType::kI64, {2}, std::vector<int64_t>{0, 1}, "r");
  EXPECT_NE(error_of([&] {
              decompress_sparse_weight("sparse-bitmask", views(bad), "m");
            }).find("m.row_offsets: row 1 starts at 1 but the bitmask puts it at 2"),
            std::string::npos);
  TensorMap zero = good;
  zero["compressed"] = bf16({3}, {1, 0, 3});
  EXPECT_NE(error_of([&] {
              decompress_sparse_weight("sparse-bitmask", views(zero), "m");
            }).find("stores only the nonzero elements"),
            std::string::npos);
}

TEST(SparsityConfig, FormatsTheProducerCannotDecompressAreRefusedByName) {
  const std::string base = R"({"quant_method":"compressed-tensors","version":"0.9.0",
      "sparsity_config":{"format":"FORMAT","sparsity_structure":"STRUCT","targets":["Linear"]}})";
  auto parse = [&](const std::string& f, const std::string& st) {
    std::string j = base;
    j.replace(j.find("FORMAT"), 6, f);
    j.replace(j.find("STRUCT"), 6, st);
    return error_of([&] { parse_compressed_tensors_config(Json::parse(j), "config.json"); });
  };
  EXPECT_NE(parse("marlin-24", "2:4").find("Marlin24Compressor has no decompress"),
            std::string::npos);
  EXPECT_NE(parse("sparse-24-bitmask", "unstructured").find("requires sparsity_structure \"2:4\""),
            std::string::npos);
  EXPECT_EQ(parse("sparse-24-bitmask", "2:4"), "");
  EXPECT_EQ(parse("sparse-bitmask", "unstructured"), "");
}

// ---- the whole path ----

fs::path scratch(const std::string& name) {
  const fs::path p = fs::temp_directory_path() /
                     ("qparity_test_sparse_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  return p;
}

Matrix read_weight(const Checkpoint& ck, const std::string& name) {
  const TensorRef& t = ck.at(name);
  Matrix m(static_cast<int64_t>(t.info->shape[0]), static_cast<int64_t>(t.info->shape[1]));
  m.data = decode_all(t.info->dtype, t.bytes(), t.info->numel(), name);
  return m;
}

// An independent 2:4 magnitude pruning: an element stays when fewer than 2 of its group of 4
// rank before it (a larger |w|, or an equal |w| at a lower index).
Matrix pruned(const Matrix& w) {
  Matrix out = w;
  for (int64_t r = 0; r < w.rows; ++r)
    for (int64_t g = 0; g < w.cols; g += 4)
      for (int64_t i = g; i < g + 4; ++i) {
        const double a = std::fabs(w.data[static_cast<size_t>(r * w.cols + i)]);
        int before = 0;
        for (int64_t j = g; j < g + 4; ++j) {
          const double b = std::fabs(w.data[static_cast<size_t>(r * w.cols + j)]);
          before += b > a || (b == a && j < i);
        }
        if (before >= 2) out.data[static_cast<size_t>(r * w.cols + i)] = 0.0;
      }
  return out;
}

TEST(SparseCheckpoint, QuantizeWritesWhatTheLoaderDecompressesToThePrunedWeights) {
  const fs::path in = scratch("fp"), fp8 = scratch("fp8"), dense = scratch("bf16");
  fixtures::write_fp_checkpoint({Arch::kQwen3Moe, fixtures::FixtureSize::kTiny, 11}, in,
                                OverwritePolicy::kRefuse);
  fixtures::QuantizeCheckpointOptions o;
  o.sparsity = "sparse-24-bitmask";
  fixtures::quantize_checkpoint(in, parse_scheme_id("fp8-channel"), Dialect::kIdeal, fp8, {},
                                OverwritePolicy::kRefuse, nullptr, o);
  fixtures::quantize_checkpoint(in, SchemeId{}, Dialect::kIdeal, dense, {},
                                OverwritePolicy::kRefuse, nullptr, o);
  const Checkpoint fp = Checkpoint::open(in);
  for (const fs::path& dir : {fp8, dense}) {
    SCOPED_TRACE(dir.string());
    const Checkpoint q = Checkpoint::open(dir);
    EXPECT_FALSE(q.contains("model.layers.0.self_attn.q_proj.weight"));
    EXPECT_TRUE(q.contains("model.layers.0.self_attn.q_proj.bitmask"));
    EXPECT_TRUE(q.contains("model.layers.0.mlp.experts.1.down_proj.compressed"));
    EXPECT_TRUE(q.contains("lm_head.weight"));                  // ignored: stored as it is
    EXPECT_TRUE(q.contains("model.layers.0.mlp.gate.weight"));  // the router, too
    auto model = load_model(dir);
    const QuantPlan& plan = model->plan();
    EXPECT_EQ(plan.method_for("model.layers.0.mlp.experts.0.up_proj").sparsity,
              "sparse-24-bitmask");
    EXPECT_EQ(plan.method_for("lm_head").sparsity, "");
    const bool quantized = dir == fp8;
    for (const DecoderLayer& l : model->layers()) {
      const std::string lp = "model.layers." + std::to_string(l.index);
      // q/k/v fused: rows in partition order.
      const Matrix got = l.attn.qkv->dequantized_weight(0);
      int64_t row = 0;
      for (const char* p : {"q_proj", "k_proj", "v_proj"}) {
        const std::string name = lp + ".self_attn." + p;
        const Matrix w = pruned(read_weight(fp, name + ".weight"));
        Matrix want = w;
        if (quantized) {
          QuantizeRequest r;
          r.weight = w;
          r.where = name;
          want = dequantize_linear(method_config(parse_scheme_id("fp8-channel"), Dialect::kIdeal),
                                   quantize_linear(parse_scheme_id("fp8-channel"), r), w.rows,
                                   w.cols, DType::kBF16);
        }
        for (int64_t i = 0; i < w.rows * w.cols; ++i)
          ASSERT_EQ(got.data[static_cast<size_t>(row * w.cols + i)],
                    want.data[static_cast<size_t>(i)])
              << name << " element " << i;
        row += w.rows;
      }
      int zeros = 0;
      for (double v : got.data)
        zeros += v == 0.0;
      EXPECT_GE(zeros * 2, static_cast<int>(got.data.size())) << lp;
    }
  }
  // A part missing is named.
  {
    const fs::path broken = scratch("broken");
    fs::copy(dense, broken);
    // The same checkpoint without one bitmask.
    const Checkpoint q = Checkpoint::open(dense);
    std::vector<TensorToWrite> keep;
    for (const auto& [name, ref] : q.tensors())
      if (name != "model.layers.0.mlp.experts.0.down_proj.bitmask")
        keep.push_back({name, ref.info->dtype, ref.info->shape, ref.bytes()});
    fs::remove(broken / "model.safetensors");
    write_safetensors(broken / "model.safetensors", std::move(keep), std::nullopt,
                      OverwritePolicy::kRefuse);
    EXPECT_NE(error_of([&] {
                load_model(broken);
              }).find("model.layers.0.mlp.experts.0.down_proj.bitmask': missing"),
              std::string::npos)
        << error_of([&] { load_model(broken); });
    fs::remove_all(broken);
  }
  for (const fs::path& p : {in, fp8, dense})
    fs::remove_all(p);
}

}  // namespace
}  // namespace qparity::reference
