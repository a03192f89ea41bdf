#pragma once
// Tests that plant faults in a checkpoint: rewrite one tensor's bytes in place, in whichever
// safetensors file of a checkpoint directory holds it.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/safetensors/safetensors_file.h"
#include "core/safetensors/safetensors_writer.h"

namespace qparity::test {

inline void edit_tensor(const std::filesystem::path& dir, const std::string& name,
                        const std::function<void(const TensorInfo&, std::vector<uint8_t>&)>& edit) {
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    std::vector<std::pair<TensorInfo, std::vector<uint8_t>>> all;
    bool found = false;
    {
      const auto f = SafetensorsFile::open(e.path());
      for (const auto& t : f.tensors()) {
        const auto b = f.bytes(t);
        all.push_back({t, {b.begin(), b.end()}});
        found = found || t.name == name;
      }
    }
    if (!found) continue;
    for (auto& [info, bytes] : all)
      if (info.name == name) edit(info, bytes);
    std::vector<TensorToWrite> w;
    for (const auto& [info, bytes] : all)
      w.push_back({info.name, info.dtype, info.shape, bytes});
    write_safetensors(e.path(), std::move(w), std::nullopt, OverwritePolicy::kReplace);
    return;
  }
  ADD_FAILURE() << "no tensor " << name << " in " << dir;
}

}  // namespace qparity::test
