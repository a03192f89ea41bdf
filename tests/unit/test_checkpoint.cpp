// Sharded checkpoints: the index must account for every tensor exactly once.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/safetensors/checkpoint.h"
#include "core/safetensors/safetensors_writer.h"
#include "test_seed.h"

namespace qparity {
namespace {

namespace fs = std::filesystem;

class CheckpointDir : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("qparity_ckpt_" + std::to_string(test::test_seed()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void shard(const std::string& file, const std::vector<std::string>& names) {
    std::vector<TensorToWrite> t;
    for (const auto& n : names)
      t.push_back({n, DType::kF32, {2}, bytes_});
    write_safetensors(dir_ / file, t, std::nullopt);
  }
  void index(const std::string& json) {
    std::ofstream(dir_ / "model.safetensors.index.json") << json;
  }
  void expect_error(const std::vector<std::string>& fragments) {
    try {
      Checkpoint::open(dir_);
      ADD_FAILURE() << "accepted; expected " << fragments[0];
    } catch (const Error& e) {
      for (const auto& f : fragments)
        EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what() << " / " << f;
    }
  }

  fs::path dir_;
  std::vector<uint8_t> bytes_ = std::vector<uint8_t>(8, 0);
};

TEST_F(CheckpointDir, ShardedWithIndex) {
  shard("model-00001-of-00002.safetensors", {"a", "b"});
  shard("model-00002-of-00002.safetensors", {"c"});
  index(R"({"metadata":{"total_size":24},"weight_map":{"a":"model-00001-of-00002.safetensors",
          "b":"model-00001-of-00002.safetensors","c":"model-00002-of-00002.safetensors"}})");
  const auto c = Checkpoint::open(dir_);
  EXPECT_EQ(c.tensors().size(), 3u);
  EXPECT_EQ(c.at("c").file->path().filename(), "model-00002-of-00002.safetensors");
  EXPECT_EQ(c.at("a").bytes().size(), 8u);
  EXPECT_THROW(c.at("d"), Error);
}

TEST_F(CheckpointDir, SingleFileAndUnindexedDirectory) {
  shard("model.safetensors", {"a", "b"});
  EXPECT_EQ(Checkpoint::open(dir_ / "model.safetensors").tensors().size(), 2u);
  EXPECT_EQ(Checkpoint::open(dir_).tensors().size(), 2u);
}

TEST_F(CheckpointDir, DuplicateNameAcrossShards) {
  shard("x.safetensors", {"a", "b"});
  shard("y.safetensors", {"b"});
  expect_error({"tensor 'b'", "x.safetensors", "y.safetensors"});
}

TEST_F(CheckpointDir, MissingShard) {
  shard("s1.safetensors", {"a"});
  index(R"({"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})");
  expect_error({"model.safetensors.index.json", "shard 's2.safetensors'", "missing"});
}

TEST_F(CheckpointDir, ListedTensorNotInItsShard) {
  shard("s1.safetensors", {"a"});
  shard("s2.safetensors", {"b"});
  index(R"({"weight_map":{"a":"s1.safetensors","b":"s1.safetensors"}})");
  expect_error({"tensor 'b'", "listed in shard 's1.safetensors'"});
}

TEST_F(CheckpointDir, UnlistedTensor) {
  shard("s1.safetensors", {"a", "extra"});
  index(R"({"weight_map":{"a":"s1.safetensors"}})");
  expect_error({"tensor 'extra'", "not listed in the index"});
}

TEST_F(CheckpointDir, ShardNameEscapingTheDirectory) {
  shard("s1.safetensors", {"a"});
  index(R"({"weight_map":{"a":"../s1.safetensors"}})");
  expect_error({"not a plain file name"});
}

TEST_F(CheckpointDir, MalformedIndex) {
  shard("s1.safetensors", {"a"});
  index(R"({"weight_map":{"a":7}})");
  expect_error({"weight_map['a']", "expected a string"});
  index(R"({"weight":{}})");
  expect_error({"missing required key 'weight_map'"});
  index(R"({"weight_map":)");
  expect_error({"invalid JSON"});
}

TEST_F(CheckpointDir, EmptyDirectoryAndMissingPath) {
  expect_error({"no *.safetensors files"});
  EXPECT_THROW(Checkpoint::open(dir_ / "nope"), Error);
}

}  // namespace
}  // namespace qparity
