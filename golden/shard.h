#pragma once
// A golden computed in pieces on several machines (a scheduler's job array): shard I of N holds
// sequences I, I+N, I+2N, ... of the run, computed exactly as the whole run computes them (each
// sequence from an empty cache, so its bits do not depend on the others). merge_shards puts the
// pieces back: the result is the golden the whole run writes, value for value, and byte for byte
// when both are written with the same SOURCE_DATE_EPOCH (write_golden stores no object times).
#include <cstdint>
#include <string>
#include <vector>

#include "golden/golden_file.h"

namespace qparity::golden {

struct ShardSpec {
  int64_t index = 0;  // I
  int64_t count = 1;  // N
};
// "I/N" with 0 <= I < N (an --shard value); errors name `where`.
ShardSpec parse_shard(const std::string& value, const std::string& where);

// The sequences shard I of N holds of a run of `total`: I, I+N, ... (empty when I >= total).
std::vector<int64_t> shard_sequences(const ShardSpec& shard, int64_t total);

// The whole run from all its shards, given in any order, each named by `files[i]` in errors.
// Refused by name: a missing or repeated shard, shards of different N or run sizes, and shards
// that disagree on anything but their sequences (checkpoint and config hashes, scheme, dialect,
// mode, producer, input set, seed, device, dtypes, run mode, capture points and their widths,
// declared-absent points, activation statistics' layers, vocabulary). Image goldens are refused.
// The merged file's `created` is the earliest shard's.
Golden merge_shards(std::vector<Golden> shards, const std::vector<std::string>& files);

}  // namespace qparity::golden
