#pragma once
// SHA-256 (FIPS 180-4), for the identity hashes golden files carry (config.json bytes, checkpoint
// tensors): incremental, so a multi-GB checkpoint is hashed from its memory map without a copy.
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace qparity {

class Sha256 {
 public:
  Sha256();
  void update(std::span<const uint8_t> bytes);
  void update(std::string_view s);
  // The digest as 64 lowercase hex characters; the object is spent afterwards.
  std::string hex();

 private:
  void block(const uint8_t* p);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  size_t used_ = 0;
  uint64_t total_ = 0;
};

std::string sha256_hex(std::span<const uint8_t> bytes);

}  // namespace qparity
