#pragma once
// Random tests draw a fresh seed per run and print it on failure; QPARITY_TEST_SEED replays one.
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>

namespace qparity::test {

inline uint64_t test_seed() {
  if (const char* s = std::getenv("QPARITY_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd();
}

inline std::string seed_note(uint64_t seed) {
  return "seed " + std::to_string(seed) +
         " (replay with QPARITY_TEST_SEED=" + std::to_string(seed) + ")";
}

}  // namespace qparity::test
