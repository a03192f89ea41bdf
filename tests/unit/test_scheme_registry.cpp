// The scheme registry: ids parse and print back, every scheme is described completely, and the
// tensor tables carry the facts of spec/FORMATS.md's format cards.
#include <cctype>
#include <functional>
#include <set>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "schemes/description/quant_plan.h"
#include "schemes/description/scheme_registry.h"

#include "error_of.h"

namespace qparity {
namespace {

std::string upper_ascii(std::string s) {
  for (char& c : s)
    c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

using ::testing::HasSubstr;

using test::error_of;

const TensorSpec* find_tensor(const SchemeInfo& s, const std::string& name,
                              const std::string& producer = "") {
  for (const TensorSpec& t : s.tensors)
    if (t.name == name && (producer.empty() || t.producer == producer)) return &t;
  return nullptr;
}

TEST(SchemeRegistry, ListsEverySchemeOfTheArchitectureInOrder) {
  const std::vector<std::string> expected = {
      "bf16",       "w8a16-ch",
      "w8a16-g<N>", "w8a8-static",
      "w8a8s",      "w8a8-int8-dyn",
      "w4a8-dyn",   "ct-w<b><a16|a8|afp8>-<g<N>|ch|tensor>[-asym][-actorder]",
      "fp8-tensor", "fp8-channel",
      "fp8-block",  "nvfp4",
      "mxint4",     "mxfp4",
      "mxfp8",      "kv-bf16",
      "kv-int8",    "kv-fp8",
      "smoothquant"};
  std::vector<std::string> ids;
  for (const SchemeInfo& s : all_schemes())
    ids.push_back(s.id);
  EXPECT_EQ(ids, expected);
  EXPECT_EQ(all_schemes().size(), std::size(kAllSchemeKinds));
  EXPECT_THAT(valid_scheme_ids(),
              ::testing::StartsWith(
                  "bf16, w8a16-ch, w8a16-g<N>, w8a8-static, w8a8s, w8a8-int8-dyn, "
                  "ct-w8a8-int8[-wtensor]-<dyn|static>[-asym], w4a8-dyn, "
                  "w4a16-g32, ct-w<b><a16|a8|afp8>-<g<N>|ch|tensor>[-asym][-actorder], fp8-tensor, "
                  "fp8-tensor-a16, fp8-channel, fp8-channel-a16, fp8-block, fp8-block-a16, nvfp4, "
                  "nvfp4a16, mxint4, mxfp4, mxfp4a16, mxfp8, mxfp8a16, kv-bf16, kv-int8, kv-fp8, "
                  "kv-fp8-head, "
                  "smoothquant; presets: UNQUANTIZED, W8A16, W4A16, W4A16_ASYM, W8A8, INT8, W4A8, "
                  "W4AFP8, W2A16,"));
}

TEST(SchemeRegistry, EveryEntryIsComplete) {
  for (const SchemeInfo& s : all_schemes()) {
    SCOPED_TRACE(s.id);
    EXPECT_EQ(&scheme_info(s.kind), &s);
    EXPECT_EQ(s.family, scheme_family(s.kind));
    EXPECT_FALSE(s.description.empty());
    EXPECT_FALSE(s.producers.empty());
    EXPECT_FALSE(s.constraints.empty());
    const bool unquantized = s.kind == SchemeKind::kKvBf16;
    EXPECT_EQ(s.tensors.empty(), unquantized);
    EXPECT_EQ(s.spec.empty(), unquantized);
    for (const TensorSpec& t : s.tensors) {
      EXPECT_FALSE(t.name.empty());
      EXPECT_FALSE(t.dtype.empty());
      EXPECT_EQ(t.shape.front(), '[');
      EXPECT_EQ(t.shape.back(), ']');
    }
    const Json j = to_json(s);
    for (const char* k : {"id", "family", "producers", "description", "parameters", "constraints",
                          "tensors", "spec"})
      EXPECT_TRUE(j.contains(k)) << k;
    EXPECT_EQ(j["id"], s.id);
  }
}

TEST(SchemeRegistry, ParseAndPrintRoundTrip) {
  for (SchemeKind k : kAllSchemeKinds) {
    if (k == SchemeKind::kW8A16Group) continue;
    // The packed-int family's default point (PackedIntPointsRoundTripThroughTheirIds: the rest).
    const std::string id =
        k == SchemeKind::kPackedInt ? "w4a16-g32" : std::string(scheme_pattern(k));
    const SchemeId s = parse_scheme_id(id);
    EXPECT_EQ(s.kind, k) << id;
    EXPECT_EQ(s.group_size, 0);
    EXPECT_EQ(to_string(s), id);
  }
  const SchemeId g = parse_scheme_id("w8a16-g128");
  EXPECT_EQ(g.kind, SchemeKind::kW8A16Group);
  EXPECT_EQ(g.group_size, 128);
  EXPECT_EQ(to_string(g), "w8a16-g128");
  EXPECT_EQ(parse_scheme_id("W8A16-G64"), (SchemeId{SchemeKind::kW8A16Group, 64}));
  EXPECT_EQ(parse_scheme_id("FP8-Block").kind, SchemeKind::kFp8Block);
}

TEST(SchemeRegistry, UnknownIdsListTheValidOnes) {
  EXPECT_EQ(error_of([] { parse_scheme_id("int4"); }),
            "scheme 'int4': unknown scheme id (valid: " + valid_scheme_ids() + ")");
  EXPECT_THAT(error_of([] { parse_scheme_id("w4a16-g128"); }),
              HasSubstr("unknown scheme id (valid: bf16, w8a16-ch, w8a16-g<N>,"));
  EXPECT_THAT(error_of([] { parse_scheme_id("w4a16-g128-asym"); }),
              ::testing::EndsWith("; compressed-tensors integer weights are spelled "
                                  "ct-w4a16-g128-asym"));
  for (const char* bad :
       {"w8a16-g0", "w8a16-g", "w8a16-g012", "w8a16-gx", "w8a16-g-1", "w8a16-g99999999"})
    EXPECT_THAT(error_of([&] { parse_scheme_id(bad); }),
                HasSubstr("w8a16-g<N> needs a group size N"))
        << bad;
}

// The integer weight-only family is a parameter space: every point has one canonical id that
// parses back to it, and compressed-tensors' preset names are names of points.
TEST(SchemeRegistry, PackedIntPointsRoundTripThroughTheirIds) {
  for (int bits = 2; bits <= 8; ++bits)
    for (int64_t group : {int64_t{16}, int64_t{32}, int64_t{64}, int64_t{128}, int64_t{1000},
                          IntWeightPoint::kChannel, IntWeightPoint::kTensor})
      for (bool sym : {true, false})
        for (bool act : {false, true}) {
          if (act && group <= 0) continue;
          const SchemeId id{SchemeKind::kPackedInt, 0, IntWeightPoint{bits, group, sym, act}};
          const std::string name = to_string(id);
          EXPECT_EQ(parse_scheme_id(name), id) << name;
          EXPECT_EQ(parse_scheme_id(upper_ascii(name)), id) << name;
          // The args the writer puts in the config resolve to the same point.
          EXPECT_EQ(packed_int_scheme(packed_int_args(id.int_weights), "args"), id) << name;
          EXPECT_EQ(effective_group_size(id), group > 0 ? group : 0) << name;
        }
  EXPECT_EQ(to_string(SchemeId{SchemeKind::kPackedInt, 0}), "w4a16-g32");
  EXPECT_EQ(parse_scheme_id("ct-w4a16-g32"), (SchemeId{SchemeKind::kPackedInt, 0}));
  EXPECT_EQ(to_string(parse_scheme_id("W4A16")), "ct-w4a16-g128");
  EXPECT_EQ(to_string(parse_scheme_id("w4a16_asym")), "ct-w4a16-g128-asym");
  EXPECT_EQ(to_string(parse_scheme_id("FP8_DYNAMIC")), "fp8-channel");
  EXPECT_EQ(to_string(parse_scheme_id("FP8_BLOCK")), "fp8-block");
  for (const char* bad : {"ct-w1a16-g32", "ct-w9a16-ch", "ct-w4a4-g32", "ct-w4a16", "ct-w4a16-g0",
                          "ct-w4a16-g032", "ct-w4a16-ch-actorder", "ct-w4a16-g32-sym",
                          "ct-w4a16-g32-actorder-asym", "ct-w4a16-g32-asym-x"})
    EXPECT_THAT(error_of([&] { parse_scheme_id(bad); }), HasSubstr("scheme '")) << bad;
  // The WnA8 / W4AFP8 points: the same weights with per-token 8-bit inputs.
  EXPECT_EQ(to_string(parse_scheme_id("ct-w4a8-g32")), "ct-w4a8-g32");
  EXPECT_EQ(parse_scheme_id("W4A8").int_inputs, IntWeightInputs::kInt8Token);
  EXPECT_EQ(parse_scheme_id("W4AFP8").int_inputs, IntWeightInputs::kFp8Token);
  // A preset qparity has no scheme for says why, with the preset's args.
  EXPECT_THAT(error_of([] { parse_scheme_id("W4A4"); }),
              HasSubstr("compressed-tensors preset W4A4 (weights int4 group(128)"));
}

TEST(SchemeRegistry, Int8W8A8PointsRoundTripThroughTheirIds) {
  for (bool tensor_weights : {false, true})
    for (bool static_inputs : {false, true})
      for (bool sym : {true, false}) {
        if (!static_inputs && !sym) continue;  // dynamic per-token inputs are symmetric
        const SchemeId id{.kind = SchemeKind::kW8A8Int8,
                          .int8_act = Int8ActPoint{tensor_weights, static_inputs, sym}};
        const std::string name = to_string(id);
        EXPECT_EQ(parse_scheme_id(name), id) << name;
        EXPECT_EQ(parse_scheme_id(upper_ascii(name)), id) << name;
        // The args the writer puts in the config resolve to the same point.
        EXPECT_EQ(w8a8_int8_scheme(w8a8_int8_weight_args(id.int8_act),
                                   w8a8_int8_input_args(id.int8_act), "args"),
                  id)
            << name;
        const ImpliedArgs a = implied_args(id);
        ASSERT_TRUE(a.input_activations.has_value()) << name;
        EXPECT_EQ(a.input_activations->is_dynamic(), !static_inputs) << name;
        EXPECT_EQ(a.input_activations->symmetric, sym) << name;
        EXPECT_EQ(a.weights->strategy,
                  tensor_weights ? QuantStrategy::kTensor : QuantStrategy::kChannel)
            << name;
      }
  // The default point keeps its name; the producer-first spelling of it is an alias.
  EXPECT_EQ(to_string(SchemeId{SchemeKind::kW8A8Int8, 0}), "w8a8-int8-dyn");
  EXPECT_EQ(parse_scheme_id("ct-w8a8-int8-dyn"), (SchemeId{SchemeKind::kW8A8Int8, 0}));
  EXPECT_EQ(to_string(parse_scheme_id("INT8")), "w8a8-int8-dyn");
  for (const char* bad : {"ct-w8a8-int8-dyn-asym", "ct-w8a8-int8", "ct-w8a8-int8-static-sym",
                          "ct-w8a8-int8-wchannel-dyn", "ct-w8a8-int8-static-asym-x"})
    EXPECT_THAT(error_of([&] { parse_scheme_id(bad); }), HasSubstr("scheme '")) << bad;
  // Outside the space: refused naming the field.
  const auto args = [](const char* j) { return parse_quant_args(Json::parse(j), "t"); };
  const QuantArgs w = args(R"({"num_bits":8,"type":"int","strategy":"channel","symmetric":true})");
  EXPECT_THAT(
      error_of([&] {
        w8a8_int8_scheme(
            w,
            args(
                R"({"num_bits":8,"type":"int","strategy":"token","symmetric":false,"dynamic":true})"),
            "m");
      }),
      HasSubstr("asymmetric dynamic per-token"));
  EXPECT_THAT(error_of([&] {
                w8a8_int8_scheme(
                    w, args(R"({"num_bits":8,"type":"int","strategy":"channel","symmetric":true})"),
                    "m");
              }),
              HasSubstr("dynamic per-token or static per-tensor"));
  EXPECT_THAT(error_of([&] {
                w8a8_int8_scheme(
                    args(R"({"num_bits":8,"type":"int","strategy":"channel","symmetric":false})"),
                    args(R"({"num_bits":8,"type":"int","strategy":"tensor","symmetric":true})"),
                    "m");
              }),
              HasSubstr("symmetric weights"));
}

TEST(SchemeRegistry, WeightOnlyFloatPointsAreTheA16Presets) {
  for (SchemeKind k : {SchemeKind::kNvfp4, SchemeKind::kMxfp4, SchemeKind::kMxfp8}) {
    const SchemeId id{.kind = k, .weight_only = true};
    const std::string name = to_string(id);
    EXPECT_EQ(name, std::string(scheme_pattern(k)) + "a16");
    EXPECT_EQ(parse_scheme_id(name), id) << name;
    EXPECT_EQ(parse_scheme_id(upper_ascii(name)), id) << name;
    const ImpliedArgs a = implied_args(id);
    EXPECT_TRUE(a.weights.has_value()) << name;
    EXPECT_FALSE(a.input_activations.has_value()) << name;
    EXPECT_TRUE(implied_args(SchemeId{k, 0}).input_activations.has_value()) << name;
  }
  // compressed-tensors' A16 presets name these points now.
  EXPECT_EQ(to_string(parse_scheme_id("NVFP4A16")), "nvfp4a16");
  EXPECT_EQ(to_string(parse_scheme_id("MXFP4A16")), "mxfp4a16");
  EXPECT_EQ(to_string(parse_scheme_id("MXFP8A16")), "mxfp8a16");
  EXPECT_THAT(error_of([] { parse_scheme_id("fp8-blocka16"); }), HasSubstr("unknown scheme id"));
}

TEST(SchemeRegistry, EveryPresetIsListedWithItsPointOrTheReason) {
  std::set<std::string> names;
  for (const SchemePreset& p : scheme_presets()) {
    names.insert(p.name);
    EXPECT_NE(p.scheme.has_value(), !p.why.empty()) << p.name;
    if (p.scheme) EXPECT_EQ(parse_scheme_id(p.name), *p.scheme) << p.name;
  }
  for (const char* n : {"W8A16", "W4A16", "W4A16_ASYM", "W8A8", "INT8", "W4A8", "FP8",
                        "FP8_DYNAMIC", "FP8_BLOCK", "NVFP4A16", "NVFP4", "MXFP4A16", "MXFP4"})
    EXPECT_TRUE(names.count(n)) << n;
}

TEST(SchemeRegistry, FamiliesAndGroupSizes) {
  EXPECT_EQ(scheme_family(SchemeKind::kKvInt8), SchemeFamily::kKvCache);
  EXPECT_EQ(scheme_family(SchemeKind::kKvFp8), SchemeFamily::kKvCache);
  EXPECT_EQ(scheme_family(SchemeKind::kSmoothQuant), SchemeFamily::kTransform);
  EXPECT_EQ(scheme_family(SchemeKind::kMxint4), SchemeFamily::kWeight);
  EXPECT_EQ(effective_group_size({SchemeKind::kW8A16Group, 256}), 256);
  EXPECT_EQ(effective_group_size({SchemeKind::kPackedInt, 0}), 32);
  EXPECT_EQ(effective_group_size({SchemeKind::kNvfp4, 0}), 16);
  EXPECT_EQ(effective_group_size({SchemeKind::kMxfp8, 0}), 32);
  EXPECT_EQ(effective_group_size({SchemeKind::kFp8Block, 0}), 128);
  EXPECT_EQ(effective_group_size({SchemeKind::kFp8Channel, 0}), 0);
}

TEST(SchemeRegistry, ProducersMatchTheSources) {
  auto producers = [](SchemeKind k) {
    std::set<std::string> out;
    for (Producer p : scheme_info(k).producers)
      out.emplace(to_string(p));
    return out;
  };
  EXPECT_EQ(producers(SchemeKind::kW8A16Channel), std::set<std::string>{"msModelSlim"});
  EXPECT_EQ(producers(SchemeKind::kW8A8Int8),
            (std::set<std::string>{"compressed-tensors", "msModelSlim"}));
  EXPECT_EQ(producers(SchemeKind::kFp8Block), (std::set<std::string>{"compressed-tensors", "fp8"}));
  EXPECT_EQ(producers(SchemeKind::kFp8Channel),
            (std::set<std::string>{"compressed-tensors", "msModelSlim", "modelopt"}));
  EXPECT_EQ(producers(SchemeKind::kNvfp4),
            (std::set<std::string>{"compressed-tensors", "modelopt"}));
  EXPECT_EQ(producers(SchemeKind::kKvFp8),
            (std::set<std::string>{"compressed-tensors", "modelopt", "engine"}));
  EXPECT_EQ(producers(SchemeKind::kPackedInt),
            (std::set<std::string>{"compressed-tensors", "gptq", "awq"}));
  EXPECT_EQ(producers(SchemeKind::kBf16), std::set<std::string>{"none"});
}

// Spot checks against the format cards (FORMATS.md §8).
TEST(SchemeRegistry, TensorTablesFollowTheFormatCards) {
  const SchemeInfo& w4 = scheme_info(SchemeKind::kPackedInt);  // C1
  ASSERT_NE(find_tensor(w4, "weight_packed"), nullptr);
  EXPECT_EQ(find_tensor(w4, "weight_packed")->dtype, "I32");
  EXPECT_EQ(find_tensor(w4, "weight_packed")->shape, "[N, ceil(K*b/32)]");
  EXPECT_EQ(find_tensor(w4, "weight_scale")->shape, "[N, K/G]");
  ASSERT_NE(find_tensor(w4, "weight_zero_point"), nullptr);
  EXPECT_EQ(find_tensor(w4, "weight_shape")->dtype, "I64");

  const SchemeInfo& nv = scheme_info(SchemeKind::kNvfp4);  // C4
  EXPECT_EQ(find_tensor(nv, "weight_packed")->dtype, "U8");
  EXPECT_EQ(find_tensor(nv, "weight_packed")->shape, "[N, K/2]");
  EXPECT_EQ(find_tensor(nv, "weight_scale")->dtype, "F8_E4M3");
  EXPECT_EQ(find_tensor(nv, "weight_scale")->shape, "[N, K/16]");
  EXPECT_EQ(find_tensor(nv, "weight_global_scale")->shape, "[1]");
  EXPECT_NE(find_tensor(nv, "input_global_scale"), nullptr);

  const SchemeInfo& mx4 = scheme_info(SchemeKind::kMxfp4);  // C5
  EXPECT_EQ(find_tensor(mx4, "weight_scale")->dtype, "U8");
  EXPECT_EQ(find_tensor(mx4, "weight_scale")->shape, "[N, K/32]");
  EXPECT_EQ(find_tensor(scheme_info(SchemeKind::kMxfp8), "weight")->dtype, "F8_E4M3");

  const SchemeInfo& blk = scheme_info(SchemeKind::kFp8Block);  // C3
  EXPECT_EQ(find_tensor(blk, "weight_scale", "compressed-tensors")->shape,
            "[ceil(N/128), ceil(K/128)]");
  EXPECT_EQ(find_tensor(blk, "weight_scale_inv", "fp8")->dtype, "F32");

  const SchemeInfo& mi = scheme_info(SchemeKind::kMxint4);  // C10: bf16 scales, not E8M0
  EXPECT_EQ(find_tensor(mi, "weight_scale")->dtype, "BF16");
  EXPECT_EQ(find_tensor(mi, "w13_weight_packed")->shape, "[E, 2I, H/8]");

  const SchemeInfo& w8a8 = scheme_info(SchemeKind::kW8A8Static);  // C12
  EXPECT_EQ(find_tensor(w8a8, "deq_scale")->dtype, "I64 or F32");
  EXPECT_EQ(find_tensor(w8a8, "quant_bias")->dtype, "I32");
  EXPECT_EQ(find_tensor(w8a8, "input_offset")->shape, "[1]");

  // msModelSlim W4A8_DYNAMIC v1 (ascendv1.py on_w4a8_dynamic, pack.py): packed along N, and a
  // scale_bias of [N, 1] or [N, 16] by the linear's name.
  const SchemeInfo& w4a8 = scheme_info(SchemeKind::kW4A8Dyn);
  EXPECT_EQ(w4a8.id, "w4a8-dyn");
  EXPECT_EQ(find_tensor(w4a8, "weight")->shape, "[N/2, K]");
  EXPECT_EQ(find_tensor(w4a8, "weight")->dtype, "I8");
  EXPECT_EQ(find_tensor(w4a8, "weight_scale")->dtype, "F32");
  std::set<std::string> bias_shapes;
  for (const TensorSpec& t : w4a8.tensors)
    if (t.name == "scale_bias") bias_shapes.insert(t.shape);
  EXPECT_EQ(bias_shapes, (std::set<std::string>{"[N, 1]", "[N, 16]"}));
  EXPECT_EQ(effective_group_size({SchemeKind::kW4A8Dyn, 0}), 0);
  EXPECT_EQ(parse_scheme_id("W4A8-DYN").kind, SchemeKind::kW4A8Dyn);

  const SchemeInfo& g = scheme_info(SchemeKind::kW8A16Group);  // C11
  EXPECT_EQ(find_tensor(g, "weight_scale")->shape, "[N, K/G]");
  EXPECT_EQ(find_tensor(g, "weight_offset")->dtype, "F32");

  const SchemeInfo& c8 = scheme_info(SchemeKind::kKvInt8);  // C15
  EXPECT_EQ(find_tensor(c8, "k_proj.kv_cache_scale")->shape, "[Hkv*D]");
  EXPECT_NE(find_tensor(c8, "v_proj.kv_cache_offset"), nullptr);

  const SchemeInfo& kv = scheme_info(SchemeKind::kKvFp8);  // C17
  EXPECT_EQ(find_tensor(kv, "k_scale")->shape, "[1]");

  const SchemeInfo& sq = scheme_info(SchemeKind::kSmoothQuant);  // C16
  EXPECT_NE(find_tensor(sq, "bias"), nullptr);
  EXPECT_NE(find_tensor(sq, "module.bias"), nullptr);
}

TEST(SchemeRegistry, ImpliedArgsDescribeEachQuantizedScheme) {
  for (SchemeKind k : kAllSchemeKinds) {
    SCOPED_TRACE(scheme_pattern(k));
    const SchemeId id{k, k == SchemeKind::kW8A16Group ? 128 : 0};
    const ImpliedArgs a = implied_args(id);
    switch (scheme_family(k)) {
      case SchemeFamily::kWeight:
        EXPECT_EQ(a.weights.has_value(), k != SchemeKind::kBf16);
        if (a.weights && effective_group_size(id) > 0 && k != SchemeKind::kFp8Block) {
          EXPECT_EQ(a.weights->effective_group_size(), effective_group_size(id));
        }
        break;
      case SchemeFamily::kKvCache:
        EXPECT_EQ(a.kv_cache.has_value(), k != SchemeKind::kKvBf16);
        break;
      case SchemeFamily::kTransform:
        EXPECT_FALSE(a.weights.has_value());
        break;
    }
  }
  const ImpliedArgs blk = implied_args({SchemeKind::kFp8Block, 0});
  EXPECT_EQ(blk.weights->block_structure, (std::array<int64_t, 2>{128, 128}));
  EXPECT_EQ(blk.input_activations->effective_group_size(), 128);
  EXPECT_FALSE(implied_args({SchemeKind::kPackedInt, 0}).input_activations.has_value());
}

}  // namespace
}  // namespace qparity
