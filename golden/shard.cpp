#include "golden/shard.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace qparity::golden {

ShardSpec parse_shard(const std::string& value, const std::string& where) {
  ShardSpec s;
  const size_t slash = value.find('/');
  const auto number = [&](const std::string& part, int64_t& out) {
    if (part.empty() || part.size() > 9 ||
        !std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return false;
    out = std::stoll(part);
    return true;
  };
  if (slash == std::string::npos || !number(value.substr(0, slash), s.index) ||
      !number(value.substr(slash + 1), s.count) || s.count < 1 || s.index >= s.count)
    throw UsageError(where, "'" + value + "': I/N with 0 <= I < N (shard I of N, e.g. 0/4)");
  return s;
}

std::vector<int64_t> shard_sequences(const ShardSpec& shard, int64_t total) {
  std::vector<int64_t> out;
  for (int64_t s = shard.index; s < total; s += shard.count)
    out.push_back(s);
  return out;
}

namespace {

std::string shard_name(const GoldenMeta& m) {
  return std::to_string(m.shard_index) + "/" + std::to_string(m.shard_count) + " of " +
         std::to_string(m.shard_total) + " sequences";
}

// Everything but the sequences must agree: an error naming the field and both files.
void check_same_run(const Golden& a, const std::string& fa, const Golden& b,
                    const std::string& fb) {
  const auto differ = [&](const std::string& what, const std::string& va, const std::string& vb) {
    if (va != vb)
      throw Error(fb, what + " '" + vb + "' differs from " + fa + "'s '" + va +
                          "': shards of different runs are not one golden");
  };
  for (const auto& [name, field] : meta_string_fields())
    if (std::string(name) != "created") differ(name, a.meta.*field, b.meta.*field);
  differ("seed", std::to_string(a.meta.seed), std::to_string(b.meta.seed));
  differ("model_dtype", a.meta.model_dtype, b.meta.model_dtype);
  differ("point_dtype", to_string(a.meta.point_precision), to_string(b.meta.point_precision));
  differ("run", to_string(a.meta.run_mode), to_string(b.meta.run_mode));
  differ("seq_len", std::to_string(a.seq_len), std::to_string(b.seq_len));
  differ("vocabulary (logits columns)", std::to_string(a.logits.cols),
         std::to_string(b.logits.cols));
  const auto absent = [](const GoldenMeta& m) {
    std::string s;
    for (const auto& p : m.absent_points)
      s += p.glob + ": " + p.reason + "; ";
    return s;
  };
  differ("absent_points", absent(a.meta), absent(b.meta));
  const auto points = [](const Golden& g) {
    std::string s;
    for (const auto& p : g.points)
      s += p.name + "[" + std::to_string(p.values.cols) + "] ";
    return s;
  };
  differ("capture points", points(a), points(b));
  const auto stats = [](const Golden& g) {
    std::string s;
    for (const auto& st : g.activation_stats)
      s += st.name + " ";
    return s;
  };
  differ("activation statistics' layers (quant_stats)", stats(a), stats(b));
}

// Rows [s*T, (s+1)*T) of `from` (a shard's j-th sequence) into sequence s of `to`.
void copy_sequence(const Array2D& from, int64_t j, Array2D& to, int64_t s, int64_t t) {
  const auto w = static_cast<size_t>(from.cols);
  std::memcpy(to.data.data() + static_cast<size_t>(s * t) * w,
              from.data.data() + static_cast<size_t>(j * t) * w, static_cast<size_t>(t) * w * 8);
}

}  // namespace

Golden merge_shards(std::vector<Golden> shards, const std::vector<std::string>& files) {
  if (shards.empty()) throw UsageError("golden merge", "give the shards to merge");
  for (size_t i = 0; i < shards.size(); ++i) {
    if (shards[i].meta.shard_count == 0)
      throw Error(files[i],
                  "is not a shard (no 'shard' attribute; golden make --shard I/N "
                  "writes shards)");
    if (!shards[i].images.empty())
      throw Error(files[i], "holds images: merging image goldens is not implemented");
  }
  const GoldenMeta& m0 = shards[0].meta;
  const int64_t n = m0.shard_count, total = m0.shard_total, t = shards[0].seq_len;
  std::vector<int> of_index(static_cast<size_t>(n), -1);
  for (size_t i = 0; i < shards.size(); ++i) {
    const GoldenMeta& m = shards[i].meta;
    if (m.shard_count != n || m.shard_total != total)
      throw Error(files[i], "is shard " + shard_name(m) + ", " + files[0] + " shard " +
                                shard_name(m0) + ": not shards of one run");
    int& slot = of_index[static_cast<size_t>(m.shard_index)];
    if (slot >= 0)
      throw Error(files[i], "repeats shard " + shard_name(m) + " (" +
                                files[static_cast<size_t>(slot)] + " is it too)");
    slot = static_cast<int>(i);
    if (i > 0) check_same_run(shards[0], files[0], shards[i], files[i]);
  }
  for (int64_t k = 0; k < n; ++k)
    if (of_index[static_cast<size_t>(k)] < 0)
      throw Error("golden merge", "shard " + std::to_string(k) + "/" + std::to_string(n) +
                                      " is missing (" + std::to_string(n) +
                                      " shards make the run; " + std::to_string(shards.size()) +
                                      " given)");

  Golden out;
  out.meta = m0;
  out.meta.shard_index = out.meta.shard_count = out.meta.shard_total = 0;
  for (const auto& g : shards)
    out.meta.created = std::min(out.meta.created, g.meta.created);  // ISO 8601: sorts as text
  out.sequences = total;
  out.seq_len = t;
  const auto rows = static_cast<size_t>(total * t);
  out.tokens.assign(rows, 0);
  out.targets.assign(rows, 0);
  out.target_logprobs.assign(rows, 0.0);
  out.sequence_nll.assign(static_cast<size_t>(total), 0.0);
  out.sequence_ppl.assign(static_cast<size_t>(total), 0.0);
  out.logits = Array2D{total * t, shards[0].logits.cols,
                       std::vector<double>(rows * static_cast<size_t>(shards[0].logits.cols))};
  for (const auto& p : shards[0].points)
    out.points.push_back(
        {p.name, Array2D{total * t, p.values.cols,
                         std::vector<double>(rows * static_cast<size_t>(p.values.cols))}});
  out.activation_stats = shards[0].activation_stats;
  for (auto& st : out.activation_stats)
    st.codes = st.saturated = st.scales = st.zero_scales = 0;
  for (int64_t k = 0; k < n; ++k) {
    const Golden& g = shards[static_cast<size_t>(of_index[static_cast<size_t>(k)])];
    const std::vector<int64_t> seqs = shard_sequences({k, n}, total);
    for (size_t j = 0; j < seqs.size(); ++j) {
      const int64_t s = seqs[j];
      const auto src = static_cast<size_t>(static_cast<int64_t>(j) * t),
                 dst = static_cast<size_t>(s * t);
      std::copy_n(g.tokens.begin() + static_cast<std::ptrdiff_t>(src), t,
                  out.tokens.begin() + static_cast<std::ptrdiff_t>(dst));
      std::copy_n(g.targets.begin() + static_cast<std::ptrdiff_t>(src), t,
                  out.targets.begin() + static_cast<std::ptrdiff_t>(dst));
      std::copy_n(g.target_logprobs.begin() + static_cast<std::ptrdiff_t>(src), t,
                  out.target_logprobs.begin() + static_cast<std::ptrdiff_t>(dst));
      out.sequence_nll[static_cast<size_t>(s)] = g.sequence_nll[j];
      out.sequence_ppl[static_cast<size_t>(s)] = g.sequence_ppl[j];
      copy_sequence(g.logits, static_cast<int64_t>(j), out.logits, s, t);
      for (size_t p = 0; p < g.points.size(); ++p)
        copy_sequence(g.points[p].values, static_cast<int64_t>(j), out.points[p].values, s, t);
    }
    // Counts over the whole run: the shards' sums (integers: order does not matter).
    for (size_t a = 0; a < g.activation_stats.size(); ++a) {
      out.activation_stats[a].codes += g.activation_stats[a].codes;
      out.activation_stats[a].saturated += g.activation_stats[a].saturated;
      out.activation_stats[a].scales += g.activation_stats[a].scales;
      out.activation_stats[a].zero_scales += g.activation_stats[a].zero_scales;
    }
  }
  return out;
}

}  // namespace qparity::golden
