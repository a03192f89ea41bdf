// SHA-256 against the FIPS 180-4 / NIST example vectors, and incremental updates in every split.
#include <gtest/gtest.h>

#include <string>

#include "core/sha256.h"

namespace qparity {
namespace {

TEST(Sha256, NistVectors) {
  EXPECT_EQ(Sha256().hex(), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  Sha256 abc;
  abc.update("abc");
  EXPECT_EQ(abc.hex(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  Sha256 two;
  two.update("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq");
  EXPECT_EQ(two.hex(), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  Sha256 million;
  const std::string chunk(1000, 'a');
  for (int i = 0; i < 1000; ++i)
    million.update(chunk);
  EXPECT_EQ(million.hex(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, AnySplitGivesTheSameDigest) {
  std::string msg;
  for (int i = 0; i < 300; ++i)
    msg.push_back(static_cast<char>(i * 37 + 11));
  Sha256 whole;
  whole.update(msg);
  const std::string want = whole.hex();
  for (size_t cut = 0; cut <= msg.size(); cut += 7) {
    Sha256 h;
    h.update(std::string_view(msg).substr(0, cut));
    h.update(std::string_view(msg).substr(cut));
    EXPECT_EQ(h.hex(), want) << cut;
  }
}

}  // namespace
}  // namespace qparity
