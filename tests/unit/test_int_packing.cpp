// Integer packings are bit-exact by definition, so they are tested exhaustively: every nibble
// pair, every int4 value, every value of every width 1..8 in every position of a word, plus
// hand-worked words from FORMATS.md 2.6(b).
#include <gtest/gtest.h>

#include <random>

#include "core/codecs/int_packing.h"
#include "core/error.h"
#include "test_seed.h"

namespace qparity {
namespace {

using codec::CtPackLayout;

TEST(Nibbles, EveryBytePairRoundTripsLowNibbleFirst) {
  for (int lo = 0; lo < 16; ++lo) {
    for (int hi = 0; hi < 16; ++hi) {
      const std::vector<uint8_t> n = {static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)};
      const auto packed = codec::pack_nibbles(n);
      ASSERT_EQ(packed.size(), 1u);
      ASSERT_EQ(packed[0], lo | (hi << 4));
      ASSERT_EQ(codec::unpack_nibbles(packed, 2), n);
    }
  }
}

TEST(Nibbles, RejectsOddCountsAndWideValues) {
  const std::vector<uint8_t> odd = {1, 2, 3};
  EXPECT_THROW(codec::pack_nibbles(odd, "w"), Error);
  const std::vector<uint8_t> wide = {1, 16};
  EXPECT_THROW(codec::pack_nibbles(wide, "w"), Error);
  const std::vector<uint8_t> bytes = {0x21};
  EXPECT_THROW(codec::unpack_nibbles(bytes, 3, "w"), Error);
}

// msModelSlim W4A8_DYNAMIC (save/utils/pack.py w4a8_pack_int4): pairs along the rows (N).
TEST(Int4RowPairs, HandWrittenMatrixPacksToTheseBytes) {
  // q [4, 3]; rows 0/1 share byte row 0, rows 2/3 byte row 1; row 2j in the low nibble.
  const std::vector<int8_t> q = {1,  -1, 7,   //
                                 2,  -8, 0,   //
                                 -3, 5,  -8,  //
                                 4,  0,  -1};
  const std::vector<int8_t> bytes = codec::pack_int4_row_pairs(q, 4, 3);
  // (1 & 0xF) | 2 << 4 = 0x21; 0xF | 0x8 << 4 = 0x8F; 7 | 0 = 0x07;
  // 0xD | 4 << 4 = 0x4D; 5 | 0 = 0x05; 0x8 | 0xF << 4 = 0xF8.
  const std::vector<uint8_t> want = {0x21, 0x8F, 0x07, 0x4D, 0x05, 0xF8};
  ASSERT_EQ(bytes.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(static_cast<uint8_t>(bytes[i]), want[i]) << "byte " << i;
  EXPECT_EQ(codec::unpack_int4_row_pairs(bytes, 4, 3), q);
}

TEST(Int4RowPairs, EveryByteValueUnpacksAndRepacksBitExactly) {
  // All 256 bytes as one [2, 256] matrix (one byte row): low nibble -> row 0, high -> row 1.
  std::vector<int8_t> bytes(256);
  for (int b = 0; b < 256; ++b)
    bytes[static_cast<size_t>(b)] = static_cast<int8_t>(static_cast<uint8_t>(b));
  const std::vector<int8_t> q = codec::unpack_int4_row_pairs(bytes, 2, 256);
  for (int b = 0; b < 256; ++b) {
    const int lo = b & 0xF, hi = b >> 4;
    ASSERT_EQ(q[static_cast<size_t>(b)], lo >= 8 ? lo - 16 : lo) << b;
    ASSERT_EQ(q[static_cast<size_t>(256 + b)], hi >= 8 ? hi - 16 : hi) << b;
  }
  EXPECT_EQ(codec::pack_int4_row_pairs(q, 2, 256), bytes);
}

TEST(Int4RowPairs, RejectsOddRowsWideCodesAndWrongSizes) {
  const std::vector<int8_t> three(3 * 2, 0);
  EXPECT_THROW(codec::pack_int4_row_pairs(three, 3, 2, "w"), Error);
  const std::vector<int8_t> wide = {8, 0};
  EXPECT_THROW(codec::pack_int4_row_pairs(wide, 2, 1, "w"), Error);
  const std::vector<int8_t> low = {-9, 0};
  EXPECT_THROW(codec::pack_int4_row_pairs(low, 2, 1, "w"), Error);
  const std::vector<int8_t> bytes = {0x21, 0x21};
  EXPECT_THROW(codec::unpack_int4_row_pairs(bytes, 2, 3, "w"), Error);
  EXPECT_THROW(codec::unpack_int4_row_pairs(bytes, 3, 2, "w"), Error);
}

TEST(Int4, EveryValueBothConventions) {
  for (int q = -8; q <= 7; ++q) {
    EXPECT_EQ(codec::nibble_to_int4(codec::int4_to_nibble(q)), q);
    EXPECT_EQ(codec::uint4b8_to_int4(codec::int4_to_uint4b8(q)), q);
    EXPECT_EQ(codec::int4_to_uint4b8(q), q + 8);
    EXPECT_EQ(codec::int4_to_nibble(q), q & 0xF);
  }
  EXPECT_THROW(codec::int4_to_nibble(8), Error);
  EXPECT_THROW(codec::int4_to_uint4b8(-9), Error);
}

TEST(CtPack, Int4HandWorkedWord) {
  // Elements 0..7 = q -8..-1 -> u 0..7; element j sits in bits 4j..4j+3: 0x76543210.
  const std::vector<int8_t> q = {-8, -7, -6, -5, -4, -3, -2, -1};
  const auto w = codec::ct_pack(q, 4, CtPackLayout::kDenseStream);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(static_cast<uint32_t>(w[0]), 0x76543210u);
  // q = 7 everywhere -> u = 15: all bits set, the int32 is -1 (bit 31 set, wraparound).
  const std::vector<int8_t> ones(8, 7);
  EXPECT_EQ(codec::ct_pack(ones, 4, CtPackLayout::kPerWord)[0], -1);
}

TEST(CtPack, Int3LayoutsDifferAsDocumented) {
  // 11 three-bit values: dense needs ceil(33/32) = 2 words and element 10 straddles them;
  // per-word holds 10 per word (bits 30-31 unused) and also needs 2 words.
  std::vector<int8_t> q(11);
  for (int i = 0; i < 11; ++i)
    q[i] = static_cast<int8_t>((i % 8) - 4);
  const auto dense = codec::ct_pack(q, 3, CtPackLayout::kDenseStream);
  const auto perword = codec::ct_pack(q, 3, CtPackLayout::kPerWord);
  ASSERT_EQ(dense.size(), 2u);
  ASSERT_EQ(perword.size(), 2u);
  EXPECT_NE(dense, perword);
  // Element 10 has u = (10 % 8) - 4 + 4 = 2 = 0b010: dense bits 30..32 -> bit 31 of word 0.
  EXPECT_EQ((static_cast<uint32_t>(dense[0]) >> 30) & 3u, 2u);
  EXPECT_EQ(static_cast<uint32_t>(dense[1]) & 1u, 0u);
  // Per-word: element 10 is the first of word 1.
  EXPECT_EQ(static_cast<uint32_t>(perword[1]) & 7u, 2u);
  EXPECT_EQ(static_cast<uint32_t>(perword[0]) >> 30, 0u);
  EXPECT_EQ(codec::ct_unpack(dense, 11, 3, CtPackLayout::kDenseStream), q);
  EXPECT_EQ(codec::ct_unpack(perword, 11, 3, CtPackLayout::kPerWord), q);
  // Reading a file with the wrong layout is caught (nonzero padding bits), not misread.
  EXPECT_THROW(codec::ct_unpack(dense, 11, 3, CtPackLayout::kPerWord), Error);
}

TEST(CtPack, EveryWidthEveryValueEveryPositionRoundTrips) {
  for (int bits = 1; bits <= 8; ++bits) {
    const int lo = -(1 << (bits - 1)), hi = (1 << (bits - 1)) - 1;
    for (auto layout : {CtPackLayout::kDenseStream, CtPackLayout::kPerWord}) {
      // 64 positions cover every bit offset inside a word for every width.
      for (int v = lo; v <= hi; ++v) {
        for (size_t pos = 0; pos < 64; ++pos) {
          std::vector<int8_t> q(64, static_cast<int8_t>(lo));
          q[pos] = static_cast<int8_t>(v);
          const auto w = codec::ct_pack(q, bits, layout);
          ASSERT_EQ(w.size(), codec::ct_packed_len(64, bits, layout));
          ASSERT_EQ(codec::ct_unpack(w, 64, bits, layout), q)
              << "bits " << bits << " value " << v << " pos " << pos;
        }
      }
      if (32 % bits == 0) {  // widths that divide 32: both layouts are the same bits
        std::vector<int8_t> q(96);
        for (size_t i = 0; i < q.size(); ++i)
          q[i] = static_cast<int8_t>(lo + int(i) % (hi - lo + 1));
        EXPECT_EQ(codec::ct_pack(q, bits, CtPackLayout::kDenseStream),
                  codec::ct_pack(q, bits, CtPackLayout::kPerWord));
      }
    }
  }
}

TEST(CtPack, RandomStreamsRoundTrip) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE(test::seed_note(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 2000; ++trial) {
    const int bits = 1 + static_cast<int>(rng() % 8);
    const size_t n = rng() % 300;
    const int lo = -(1 << (bits - 1));
    std::vector<int8_t> q(n);
    for (auto& x : q)
      x = static_cast<int8_t>(lo + static_cast<int>(rng() % (1u << bits)));
    for (auto layout : {CtPackLayout::kDenseStream, CtPackLayout::kPerWord})
      ASSERT_EQ(codec::ct_unpack(codec::ct_pack(q, bits, layout), n, bits, layout), q);
  }
}

TEST(CtPack, RejectsOutOfRangeValuesAndWrongWordCounts) {
  const std::vector<int8_t> q = {8};
  try {
    codec::ct_pack(q, 4, CtPackLayout::kDenseStream, "layers.0.mlp.down_proj.weight_packed");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.0.mlp.down_proj.weight_packed"),
              std::string::npos);
    EXPECT_NE(std::string(e.what()).find("[-8, 7]"), std::string::npos);
  }
  const std::vector<int32_t> w = {0, 0};
  EXPECT_THROW(codec::ct_unpack(w, 8, 4, CtPackLayout::kDenseStream), Error);
  EXPECT_THROW(codec::ct_pack(q, 9, CtPackLayout::kDenseStream), Error);
  EXPECT_THROW(codec::ct_pack(q, 0, CtPackLayout::kDenseStream), Error);
}

}  // namespace
}  // namespace qparity
