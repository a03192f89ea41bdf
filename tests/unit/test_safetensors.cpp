// safetensors reader and writer: byte-exact vectors from the reference implementation's own
// tests, round trips of every dtype, the torch-written fixture, and every malformed-header rule.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/codecs/float_format.h"
#include "core/error.h"
#include "core/safetensors/safetensors_file.h"
#include "core/safetensors/safetensors_writer.h"
#include "schemes/method/tensor_decode.h"
#include "test_seed.h"

namespace qparity {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> raw_file(const std::string& header, size_t data_bytes,
                              uint64_t len_override = 0) {
  std::vector<uint8_t> out;
  const uint64_t n = len_override ? len_override : header.size();
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<uint8_t>(n >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.resize(out.size() + data_bytes, 0);
  return out;
}

// Expects parse_safetensors to reject `bytes` with a message containing every fragment.
void expect_rejected(const std::vector<uint8_t>& bytes, const std::vector<std::string>& fragments) {
  try {
    parse_safetensors(bytes, "bad.safetensors");
    ADD_FAILURE() << "accepted a malformed file; expected: " << fragments[0];
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("bad.safetensors", 0), 0u) << msg;
    for (const auto& f : fragments)
      EXPECT_NE(msg.find(f), std::string::npos) << msg << " / " << f;
  }
}

TEST(SafetensorsWriter, MatchesReferenceImplementationBytes) {
  // Vectors from huggingface/safetensors tensor.rs tests (test_serialization, test_empty).
  std::vector<uint8_t> data;
  for (float f : {0.f, 1.f, 2.f, 3.f, 4.f, 5.f}) {
    uint8_t b[4];
    std::memcpy(b, &f, 4);
    data.insert(data.end(), b, b + 4);
  }
  const auto out = serialize_safetensors({{"attn.0", DType::kF32, {1, 2, 3}, data}}, std::nullopt);
  const std::vector<uint8_t> want = {
      64, 0,  0,   0,   0,   0,   0,   0,   123, 34,  97,  116, 116, 110, 46,  48,
      34, 58, 123, 34,  100, 116, 121, 112, 101, 34,  58,  34,  70,  51,  50,  34,
      44, 34, 115, 104, 97,  112, 101, 34,  58,  91,  49,  44,  50,  44,  51,  93,
      44, 34, 100, 97,  116, 97,  95,  111, 102, 102, 115, 101, 116, 115, 34,  58,
      91, 48, 44,  50,  52,  93,  125, 125, 0,   0,   0,   0,   0,   0,   128, 63,
      0,  0,  0,   64,  0,   0,   64,  64,  0,   0,   128, 64,  0,   0,   160, 64};
  EXPECT_EQ(out, want);
  EXPECT_EQ(serialize_safetensors({}, std::nullopt),
            (std::vector<uint8_t>{8, 0, 0, 0, 0, 0, 0, 0, 123, 125, 32, 32, 32, 32, 32, 32}));
  const std::vector<uint8_t> with_meta = {
      40,  0,   0,   0,  0,  0,  0,   0,   123, 34,  95,  95,  109, 101, 116, 97,
      100, 97,  116, 97, 95, 95, 34,  58,  123, 34,  102, 114, 97,  109, 101, 119,
      111, 114, 107, 34, 58, 34, 112, 116, 34,  125, 125, 32,  32,  32,  32,  32};
  EXPECT_EQ(serialize_safetensors({}, std::map<std::string, std::string>{{"framework", "pt"}}),
            with_meta);
}

TEST(SafetensorsWriter, RoundTripsEveryDtypeBitIdentically) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::mt19937_64 rng(seed);
  std::vector<std::vector<uint8_t>> storage;
  std::vector<TensorToWrite> tensors;
  for (DType t : kAllDTypes) {
    std::vector<uint64_t> shape = {3, 2 * (2 + rng() % 3)};  // even: F4 fills whole bytes
    if (dtype_bits(t) == 6) shape = {2, 4};                  // 48 bits: whole bytes
    uint64_t bits = dtype_bits(t) * shape[0] * shape[1];
    storage.emplace_back(bits / 8);
    for (auto& b : storage.back())
      b = static_cast<uint8_t>(rng());
    tensors.push_back({"t." + std::string(dtype_name(t)), t, shape, storage.back()});
  }
  tensors.push_back({"empty", DType::kBF16, {0, 7}, {}});
  tensors.push_back({"scalar", DType::kF32, {}, std::span<const uint8_t>(storage[15].data(), 4)});
  const fs::path dir = fs::temp_directory_path() / ("qparity_st_" + std::to_string(seed));
  fs::create_directories(dir);
  const fs::path path = dir / "all.safetensors";
  write_safetensors(path, tensors, std::map<std::string, std::string>{{"format", "pt"}});
  const auto f = SafetensorsFile::open(path);
  ASSERT_EQ(f.tensors().size(), tensors.size());
  EXPECT_EQ(f.metadata().at("format"), "pt");
  for (const auto& t : tensors) {
    const TensorInfo& info = f.at(t.name);
    EXPECT_EQ(info.dtype, t.dtype);
    EXPECT_EQ(info.shape, t.shape);
    const auto got = f.bytes(info);
    ASSERT_TRUE(std::equal(got.begin(), got.end(), t.bytes.begin(), t.bytes.end())) << t.name;
  }
  // Nothing overwrites a file unless asked.
  EXPECT_THROW(write_safetensors(path, tensors, std::nullopt), Error);
  write_safetensors(path, {}, std::nullopt, OverwritePolicy::kReplace);
  EXPECT_TRUE(SafetensorsFile::open(path).tensors().empty());
  fs::remove_all(dir);
}

// The assembler (files larger than memory) writes what write_safetensors writes, bit for bit:
// tensors of every dtype given in a random order, some spilled, some views, one past the 64 MiB
// copy piece; the views' after_write runs once each; the spill is gone after write and after an
// abandoned assembly; duplicates and size mismatches are refused at add time.
TEST(SafetensorsWriter, AssemblerWritesTheSameBytesAsWriteSafetensors) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::mt19937_64 rng(seed);
  std::vector<std::vector<uint8_t>> storage;
  std::vector<TensorToWrite> tensors;
  for (int rep = 0; rep < 2; ++rep)
    for (DType t : kAllDTypes) {
      std::vector<uint64_t> shape = {3, 2 * (2 + rng() % 3)};
      if (dtype_bits(t) == 6) shape = {2, 4};
      storage.emplace_back(dtype_bits(t) * shape[0] * shape[1] / 8);
      for (auto& b : storage.back())
        b = static_cast<uint8_t>(rng());
      tensors.push_back(
          {"t" + std::to_string(rep) + "." + std::string(dtype_name(t)), t, shape, storage.back()});
    }
  storage.emplace_back((uint64_t{64} << 20) + 4096 + 2);  // two pieces and a bit, as bf16
  for (size_t i = 0; i < storage.back().size(); i += 8) {
    const uint64_t r = rng();
    std::memcpy(storage.back().data() + i, &r, std::min<size_t>(8, storage.back().size() - i));
  }
  tensors.push_back({"big", DType::kBF16, {storage.back().size() / 2}, storage.back()});
  tensors.push_back({"empty", DType::kBF16, {0, 7}, {}});
  std::shuffle(tensors.begin(), tensors.end(), rng);

  const fs::path dir = fs::temp_directory_path() / ("qparity_asm_" + std::to_string(seed));
  fs::create_directories(dir);
  const std::map<std::string, std::string> meta{{"format", "pt"}};
  write_safetensors(dir / "want.safetensors", tensors, meta);
  std::map<std::string, int> written;
  {
    SafetensorsAssembler a(dir / ".spill");
    for (size_t i = 0; i < tensors.size(); ++i) {
      const TensorToWrite& t = tensors[i];
      if (i % 2 == 0) {
        a.add(t.name, t.dtype, t.shape, t.bytes);
      } else {
        a.add_view(t.name, t.dtype, t.shape, t.bytes, [&written, n = t.name] { ++written[n]; });
      }
    }
    EXPECT_EQ(a.size(), tensors.size());
    EXPECT_TRUE(fs::exists(dir / ".spill"));
    EXPECT_THROW(a.add(tensors[0].name, tensors[0].dtype, tensors[0].shape, tensors[0].bytes),
                 Error);
    EXPECT_THROW(a.add("short", DType::kF32, {2}, std::span<const uint8_t>(storage[0].data(), 4)),
                 Error);
    a.write(dir / "got.safetensors", meta, OverwritePolicy::kRefuse);
    EXPECT_FALSE(fs::exists(dir / ".spill"));
  }
  for (size_t i = 1; i < tensors.size(); i += 2)
    EXPECT_EQ(written[tensors[i].name], 1) << tensors[i].name;
  EXPECT_EQ(written.size(), tensors.size() / 2);
  auto read = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
  };
  const std::vector<uint8_t> want = read(dir / "want.safetensors");
  ASSERT_GT(want.size(), uint64_t{64} << 20);
  EXPECT_TRUE(read(dir / "got.safetensors") == want);
  {
    // Refuses to overwrite unless asked, leaving the file as it was.
    SafetensorsAssembler a(dir / ".spill2");
    a.add("x", DType::kU8, {1}, std::span<const uint8_t>(storage[0].data(), 1));
    EXPECT_THROW(a.write(dir / "got.safetensors", meta, OverwritePolicy::kRefuse), Error);
  }
  EXPECT_FALSE(fs::exists(dir / ".spill2"));
  EXPECT_TRUE(read(dir / "got.safetensors") == want);
  {
    SafetensorsAssembler a(dir / ".spill3");
    a.add("x", DType::kU8, {1}, std::span<const uint8_t>(storage[0].data(), 1));
  }  // abandoned: nothing written, the spill removed
  EXPECT_FALSE(fs::exists(dir / ".spill3"));
  fs::remove_all(dir);
}

TEST(SafetensorsReader, ReadsTheTorchWrittenFixture) {
  // Written on the GPU image by tools/device/make_torch_safetensors_fixture.py with
  // safetensors.torch.save_file; the expected values are the script's own inputs.
  const fs::path p = fs::path(QPARITY_SOURCE_DIR) / "tests/data/torch_saved.safetensors";
  const auto f = SafetensorsFile::open(p);
  EXPECT_EQ(f.metadata().at("producer"), "qparity-fixture");
  auto values = [&](const std::string& name) {
    const auto& t = f.at(name);
    return reference::decode_all(t.dtype, f.bytes(t), t.numel(), name);
  };
  std::vector<double> ramp;
  for (int i = 0; i < 12; ++i)
    ramp.push_back(i * 0.5 - 1.0);
  EXPECT_EQ(f.at("f32").shape, (std::vector<uint64_t>{3, 4}));
  EXPECT_EQ(values("f32"), ramp);
  EXPECT_EQ(values("f64"), ramp);
  EXPECT_EQ(values("bf16"), ramp);  // all exactly representable
  EXPECT_EQ(values("f16"), ramp);
  EXPECT_EQ(f.at("bf16").dtype, DType::kBF16);
  // torch casts with RNE and no saturation; the script clamps first, as every engine does.
  const std::vector<double> e4m3_in = {0, 0.5, -1.5, 448, -448, 0.001953125, 300, -2.75, 0.3};
  std::vector<double> e4m3_want;
  for (double x : e4m3_in)
    e4m3_want.push_back(codec::round_to(codec::kE4M3FN, x, codec::Overflow::kNonSaturating));
  EXPECT_EQ(f.at("f8_e4m3").dtype, DType::kF8E4M3);
  EXPECT_EQ(values("f8_e4m3"), e4m3_want);
  const std::vector<double> e5m2_in = {0, 0.5, -1.5, 57344, -3.0e-5, 0.3};
  std::vector<double> e5m2_want;
  for (double x : e5m2_in)
    e5m2_want.push_back(codec::round_to(codec::kE5M2, x, codec::Overflow::kNonSaturating));
  EXPECT_EQ(values("f8_e5m2"), e5m2_want);
  EXPECT_EQ(values("i8"), (std::vector<double>{-4, -3, -2, -1, 0, 1, 2, 3}));
  EXPECT_EQ(values("u8"), (std::vector<double>{0, 50, 100, 150, 200, 250}));
  EXPECT_EQ(values("i32"), (std::vector<double>{-2147483648.0, -1, 0, 2147483647.0}));
  EXPECT_EQ(values("i64"), (std::vector<double>{-9007199254740992.0, 0, 9007199254740992.0}));
  EXPECT_EQ(values("bool"), (std::vector<double>{1, 0, 1}));
  ASSERT_NE(f.find("f8_e8m0"), nullptr) << "torch on the GPU image has float8_e8m0fnu";
  EXPECT_EQ(f.at("f8_e8m0").dtype, DType::kF8E8M0);
  EXPECT_EQ(values("f8_e8m0"),
            (std::vector<double>{1.0, 2.0, 0.5, std::ldexp(1.0, -127), std::ldexp(1.0, 127)}));
  // Our writer reproduces torch's file byte for byte from the same tensors and metadata.
  std::vector<TensorToWrite> again;
  for (const auto& t : f.tensors())
    again.push_back({t.name, t.dtype, t.shape, f.bytes(t)});
  const auto ours = serialize_safetensors(again, f.metadata());
  std::ifstream in(p, std::ios::binary);
  const std::vector<uint8_t> theirs((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(ours, theirs);
}

TEST(SafetensorsReader, RejectsMalformedHeaders) {
  const std::string ok_entry = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  // Sanity: the well-formed base case parses.
  EXPECT_NO_THROW(parse_safetensors(raw_file("{" + ok_entry + "}", 8), "ok"));

  expect_rejected({1, 2, 3}, {"3 bytes", "shorter than the 8-byte header"});
  auto truncated = raw_file("{" + ok_entry + "}", 8);
  truncated.resize(truncated.size() - 3);
  expect_rejected(truncated, {"tensor 'a'", "past the data region"});
  expect_rejected(raw_file("{}", 0, 4096), {"header length 4096 runs past the end"});
  expect_rejected(raw_file("{}", 0, uint64_t{1} << 63), {"9223372036854775808", "runs past"});
  auto huge = raw_file("{}", 0, kMaxSafetensorsHeaderBytes + 1);
  huge.resize(8 + kMaxSafetensorsHeaderBytes + 8, ' ');
  expect_rejected(huge, {"exceeds the limit"});
  expect_rejected(raw_file("[1,2]", 0), {"does not start with '{'"});
  expect_rejected(raw_file("{\"a\":", 0), {"not valid UTF-8 JSON"});
  // Fuzzer finding: a number beyond double raised nlohmann's out_of_range, not parse_error.
  expect_rejected(raw_file(R"({"x":{"dtype":1e616}})", 0), {"not valid UTF-8 JSON", "1e616"});
  expect_rejected(raw_file(R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", 8),
                  {"tensor 'a'", "unknown dtype 'F33'"});
  expect_rejected(raw_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
                  {"tensor 'a'", "12 bytes", "span 8"});
  expect_rejected(raw_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
                  {"shape[0]", "non-negative"});
  expect_rejected(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8),
                  {"end before begin"});
  expect_rejected(
      raw_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})",
               8),
      {"overflows"});
  expect_rejected(raw_file(R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}})", 1),
                  {"whole bytes"});
  // Overlap and gap.
  expect_rejected(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                           12),
                  {"tensor 'b'", "overlap tensor 'a'"});
  expect_rejected(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
                           20),
                  {"tensor 'b'", "gap of 4 bytes"});
  expect_rejected(raw_file("{" + ok_entry + "}", 12), {"cover 8 bytes", "12"});
  expect_rejected(raw_file("{" + ok_entry + "," + ok_entry + "}", 8), {"duplicate key 'a'"});
  expect_rejected(raw_file(R"({"__metadata__":{"k":1}})", 0), {"__metadata__", "'k'", "string"});
  expect_rejected(raw_file(R"({"__metadata__":[1]})", 0), {"__metadata__ must be an object"});
  expect_rejected(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8),
                  {"unexpected key 'x'"});
  expect_rejected(raw_file(R"({"a":{"dtype":"F32","shape":[2]}})", 8),
                  {"missing required key 'data_offsets'"});
  expect_rejected(raw_file(R"({"a":7})", 0), {"entry must be an object"});
  expect_rejected(raw_file(R"({"":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8),
                  {"empty name"});
  // A name that is not valid UTF-8 (a lone continuation byte).
  expect_rejected(
      raw_file("{\"a\x80\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8),
      {"not valid UTF-8 JSON"});
}

TEST(SafetensorsReader, OpenNamesTheFileForMissingAndTruncatedFiles) {
  const fs::path dir =
      fs::temp_directory_path() / ("qparity_st_open_" + std::to_string(test::test_seed()));
  fs::create_directories(dir);
  try {
    SafetensorsFile::open(dir / "nope.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nope.safetensors"), std::string::npos);
  }
  std::ofstream(dir / "empty.safetensors").close();
  EXPECT_THROW(SafetensorsFile::open(dir / "empty.safetensors"), Error);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace qparity
