// Golden schema v1 I/O: round trips bit for bit, float32 points round once, shapes are checked
// on write, version / datasets / file type on read, and nothing is overwritten unless asked.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <vector>

#include "error_of.h"
#include "golden/golden_file.h"
#include "scratch_dir.h"
#include "test_seed.h"

namespace qparity::golden {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using ::testing::HasSubstr;

Golden sample() {
  Golden g;
  g.meta.producer_version = "test";
  g.meta.model = "m";
  g.meta.architecture = "LlamaForCausalLM";
  g.meta.model_config_hash = std::string(64, 'a');
  g.meta.checkpoint_hash = std::string(64, 'b');
  g.meta.scheme = "fp8-block";
  g.meta.dialect = "vllm";
  g.meta.precision_mode = "exact";
  g.meta.seed = 0xFFFFFFFFFFFFFFF1ull;  // uint64 survives
  g.meta.input_set = "synthetic:2x3:seed=1";
  g.meta.device = "cpu-reference";
  g.sequences = 2;
  g.seq_len = 3;
  g.tokens = {5, 1, 4, 2, 2, 0};
  g.targets = {1, 4, -1, 2, 0, -1};
  // Out of alphabetical order on purpose: the file must keep execution order.
  const char* names[] = {"embed", "layers.0.attn.qkv", "layers.0.residual", "final_norm"};
  double v = 0.1;
  for (const char* n : names) {
    Array2D a{6, 4, {}};
    for (int i = 0; i < 24; ++i)
      a.data.push_back(v += 1.0 / 3.0);
    g.points.push_back({n, a});
  }
  g.logits = Array2D{6, 7, {}};
  for (int i = 0; i < 42; ++i)
    g.logits.data.push_back(std::sin(i * 0.7) * 3.0);
  g.target_logprobs = {-1.5, -2.25, std::nan(""), -0.5, -3.0, std::nan("")};
  g.sequence_nll = {1.875, 1.75};
  g.sequence_ppl = {std::exp(1.875), std::exp(1.75)};
  g.activation_stats = {{"layers.0.attn.qkv_proj", 768, 3, 6, 0},
                        {"layers.0.attn.o_proj", 512, 0, 6, 1}};  // not alphabetical on purpose
  return g;
}

fs::path temp_file(const std::string& name) {
  return test::scratch_dir("qparity_golden") / name;
}

TEST(GoldenFile, RoundTripsBitForBitInExecutionOrder) {
  const Golden g = sample();
  const fs::path p = temp_file("rt.h5");
  write_golden(p, g, OverwritePolicy::kRefuse);
  const auto r = GoldenReader::open(p);
  EXPECT_EQ(r.meta().scheme, "fp8-block");
  EXPECT_EQ(r.meta().dialect, "vllm");
  EXPECT_EQ(r.meta().seed, 0xFFFFFFFFFFFFFFF1ull);
  EXPECT_EQ(r.meta().model_config_hash, g.meta.model_config_hash);
  EXPECT_FALSE(r.meta().created.empty());
  EXPECT_EQ(r.sequences(), 2);
  EXPECT_EQ(r.seq_len(), 3);
  EXPECT_EQ(r.tokens(), g.tokens);
  EXPECT_EQ(r.targets(), g.targets);
  EXPECT_EQ(r.point_names(), (std::vector<std::string>{"embed", "layers.0.attn.qkv",
                                                       "layers.0.residual", "final_norm"}));
  const Golden back = r.read_all();
  for (size_t i = 0; i < g.points.size(); ++i)
    EXPECT_EQ(back.points[i].values.data, g.points[i].values.data) << g.points[i].name;
  EXPECT_EQ(back.logits.data, g.logits.data);
  EXPECT_EQ(back.logits.cols, 7);
  EXPECT_TRUE(std::isnan(back.target_logprobs[2]));
  EXPECT_EQ(back.target_logprobs[4], -3.0);
  EXPECT_EQ(back.sequence_nll, g.sequence_nll);
  ASSERT_EQ(back.activation_stats.size(), 2u);
  EXPECT_EQ(back.activation_stats[0].name, "layers.0.attn.qkv_proj");
  EXPECT_EQ(back.activation_stats[0].saturated, 3);
  EXPECT_EQ(back.activation_stats[1].zero_scales, 1);
  EXPECT_EQ(back.activation_stats[1].codes, 512);
  EXPECT_THAT(error_of([&] { r.point("layers.9.attn.out"); }), HasSubstr("no capture point"));
  fs::remove_all(p.parent_path());
}

TEST(GoldenFile, Float32PointsRoundOnceAndAreRecorded) {
  Golden g = sample();
  g.meta.point_precision = PointPrecision::kF32;
  const fs::path p = temp_file("f32.h5");
  write_golden(p, g, OverwritePolicy::kRefuse);
  const auto r = GoldenReader::open(p);
  EXPECT_EQ(r.meta().point_precision, PointPrecision::kF32);
  const Array2D a = r.point("layers.0.attn.qkv");
  for (size_t i = 0; i < a.data.size(); ++i)
    EXPECT_EQ(a.data[i], static_cast<double>(static_cast<float>(g.points[1].values.data[i])));
  EXPECT_EQ(r.logits().data, g.logits.data);  // logits stay float64
  fs::remove_all(p.parent_path());
}

TEST(GoldenFile, NeverOverwritesUnlessAsked) {
  const fs::path p = temp_file("keep.h5");
  write_golden(p, sample(), OverwritePolicy::kRefuse);
  Golden other = sample();
  other.meta.scheme = "nvfp4";
  EXPECT_THAT(error_of([&] { write_golden(p, other, OverwritePolicy::kRefuse); }),
              HasSubstr("exists"));
  EXPECT_EQ(GoldenReader::open(p).meta().scheme, "fp8-block");
  write_golden(p, other, OverwritePolicy::kReplace);
  EXPECT_EQ(GoldenReader::open(p).meta().scheme, "nvfp4");
  for (const auto& e : fs::directory_iterator(p.parent_path()))  // no temp files left behind
    EXPECT_EQ(e.path().filename(), "keep.h5");
  fs::remove_all(p.parent_path());
}

TEST(GoldenFile, WriterChecksShapes) {
  const fs::path p = temp_file("bad.h5");
  Golden g = sample();
  g.points[2].values.rows = 5;
  g.points[2].values.data.resize(20);
  EXPECT_THAT(error_of([&] { write_golden(p, g, OverwritePolicy::kRefuse); }),
              HasSubstr("points/layers.0.residual has 5 rows"));
  g = sample();
  g.targets[0] = 7;  // vocab is 7: targets live in [-1, 7)
  EXPECT_THAT(error_of([&] { write_golden(p, g, OverwritePolicy::kRefuse); }),
              HasSubstr("inputs/targets holds 7"));
  g = sample();
  g.points.push_back(g.points[0]);
  EXPECT_THAT(error_of([&] { write_golden(p, g, OverwritePolicy::kRefuse); }),
              HasSubstr("'embed' given twice"));
  EXPECT_FALSE(fs::exists(p));
  fs::remove_all(p.parent_path());
}

TEST(GoldenFile, ReaderChecksVersionDatasetsAndFileType) {
  const fs::path p = temp_file("v.h5");
  write_golden(p, sample(), OverwritePolicy::kRefuse);
  {
    const hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    const hid_t a = H5Aopen(f, "schema_version", H5P_DEFAULT);
    const int32_t two = 2;
    H5Awrite(a, H5T_NATIVE_INT32, &two);
    H5Aclose(a);
    H5Fclose(f);
  }
  EXPECT_THAT(error_of([&] { GoldenReader::open(p); }),
              HasSubstr("golden schema version 2; this qparity reads version 1"));
  write_golden(p, sample(), OverwritePolicy::kReplace);
  {
    const hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    H5Ldelete(f, "outputs/logits", H5P_DEFAULT);
    H5Fclose(f);
  }
  EXPECT_THAT(error_of([&] { GoldenReader::open(p); }), HasSubstr("outputs/logits (missing)"));
  {
    const hid_t f = H5Fcreate(p.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    H5Fclose(f);
  }
  EXPECT_THAT(error_of([&] { GoldenReader::open(p); }), HasSubstr("not a qparity golden file"));
  std::ofstream(p) << "not hdf5";
  EXPECT_THAT(error_of([&] { GoldenReader::open(p); }), HasSubstr("not an HDF5 file"));
  EXPECT_THAT(error_of([&] { GoldenReader::open(p.parent_path() / "none.h5"); }),
              HasSubstr("no such file"));
  fs::remove_all(p.parent_path());
}

// Replaces dataset `name` of file `p` by one of `type` and `dims` (values 0); a capture point
// keeps an `order` attribute.
void replace_dataset(const fs::path& p, const char* name, hid_t type,
                     const std::vector<hsize_t>& dims) {
  const hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  H5Ldelete(f, name, H5P_DEFAULT);
  const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  const hid_t ds = H5Dcreate2(f, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (std::string(name).rfind("points/", 0) == 0) {
    const hid_t scalar = H5Screate(H5S_SCALAR);
    const hid_t a = H5Acreate2(ds, "order", H5T_STD_I64LE, scalar, H5P_DEFAULT, H5P_DEFAULT);
    const int64_t order = 1;
    H5Awrite(a, H5T_NATIVE_INT64, &order);
    H5Aclose(a);
    H5Sclose(scalar);
  }
  H5Dclose(ds);
  H5Sclose(space);
  H5Fclose(f);
}

// What the schema forbids is refused by name, before any allocation it could blow up (issue:
// zero sequences accepted and judged "PASS"; float16 logits read silently; a point declared
// [16, 2^34] ended in std::bad_alloc; `golden info` hung on a FIFO).
TEST(GoldenFile, ReaderRefusesWhatTheSchemaForbids) {
  const fs::path p = temp_file("bad.h5");
  write_golden(p, sample(), OverwritePolicy::kReplace);
  replace_dataset(p, "inputs/tokens", H5T_STD_I64LE, {0, 3});
  replace_dataset(p, "inputs/targets", H5T_STD_I64LE, {0, 3});
  EXPECT_THAT(error_of([&] { GoldenReader::open(p); }),
              HasSubstr("inputs/targets: is empty (0 x 3)"));

  write_golden(p, sample(), OverwritePolicy::kReplace);
  // IEEE binary16, built by hand: HDF5 1.10 has no predefined half type.
  const hid_t f16 = H5Tcopy(H5T_IEEE_F32LE);
  H5Tset_fields(f16, 15, 10, 5, 0, 10);
  H5Tset_precision(f16, 16);
  H5Tset_size(f16, 2);
  H5Tset_ebias(f16, 15);
  replace_dataset(p, "outputs/logits", f16, {6, 7});
  H5Tclose(f16);
  EXPECT_THAT(error_of([&] { GoldenReader::open(p).logits(); }),
              HasSubstr("outputs/logits: is stored as a 16-bit float; the schema needs at least "
                        "32 bits"));

  write_golden(p, sample(), OverwritePolicy::kReplace);
  replace_dataset(p, "points/layers.0.attn.qkv", H5T_IEEE_F64LE, {6, hsize_t{1} << 40});
  EXPECT_THAT(error_of([&] { GoldenReader::open(p).point("layers.0.attn.qkv"); }),
              HasSubstr("points/layers.0.attn.qkv: declares shape [6, 1099511627776], more than "
                        "this machine's"));

  replace_dataset(p, "points/embed", H5T_STD_I32LE, {6, 4});
  EXPECT_THAT(error_of([&] { GoldenReader::open(p).point("embed"); }),
              HasSubstr("points/embed: must be floating point"));

  // A target outside the logits' vocabulary is named with the file at open (compare used to
  // stop in compare_logits naming only the row).
  write_golden(p, sample(), OverwritePolicy::kReplace);
  {
    const hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    const hid_t ds = H5Dopen2(f, "inputs/targets", H5P_DEFAULT);
    const int64_t targets[6] = {1, 4, -1, 2, 99, -1};
    H5Dwrite(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, targets);
    H5Dclose(ds);
    H5Fclose(f);
  }
  EXPECT_THAT(error_of([&] { GoldenReader::open(p); }),
              HasSubstr("bad.h5: inputs/targets holds 99 at row 4, outside [-1, vocab 7)"));

  const fs::path fifo = temp_file("fifo.h5");
  fs::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THAT(error_of([&] { GoldenReader::open(fifo); }), HasSubstr("not a regular file"));
  fs::remove_all(p.parent_path());
}

TEST(GoldenFile, RunModeRoundTripsAndOldLayerLocalDumpsAreRecognized) {
  const fs::path p = temp_file("run.h5");
  Golden g = sample();
  EXPECT_EQ(GoldenReader::open((write_golden(p, g, OverwritePolicy::kReplace), p)).meta().run_mode,
            RunMode::kFree);
  g.meta.run_mode = RunMode::kLayerLocal;
  write_golden(p, g, OverwritePolicy::kReplace);
  EXPECT_EQ(GoldenReader::open(p).meta().run_mode, RunMode::kLayerLocal);
  // Dumps written before the `run` attribute said so in their input set.
  g.meta.run_mode = RunMode::kFree;
  g.meta.input_set = "layer-local:synthetic:2x3:seed=1";
  write_golden(p, g, OverwritePolicy::kReplace);
  {
    const hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    H5Adelete(f, "run");
    H5Fclose(f);
  }
  EXPECT_EQ(GoldenReader::open(p).meta().run_mode, RunMode::kLayerLocal);
  fs::remove_all(p.parent_path());
}

}  // namespace
}  // namespace qparity::golden
