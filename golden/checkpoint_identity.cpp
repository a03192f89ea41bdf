#include "golden/checkpoint_identity.h"

#include <sstream>

#include "core/config/model_config.h"
#include "core/dtype.h"
#include "core/input_file.h"
#include "core/safetensors/checkpoint.h"
#include "core/sha256.h"

namespace qparity::golden {

namespace fs = std::filesystem;

std::string model_name(const fs::path& model_dir) {
  const fs::path p = model_dir.lexically_normal();
  return p.has_filename() ? p.filename().string() : p.parent_path().filename().string();
}

std::string plan_scheme(const QuantPlan& plan) {
  std::string out;
  for (const auto& [scheme, count] : plan.summary()) {
    if (scheme == "none" || scheme == "bf16" || scheme == "kv-bf16") continue;
    out += (out.empty() ? "" : "+") + scheme;
  }
  return out.empty() ? "bf16" : out;
}

std::string checkpoint_scheme(const fs::path& model_dir) {
  return plan_scheme(
      build_quant_plan(load_model_config(model_dir / "config.json"), model_dir, std::nullopt));
}

std::string config_hash(const fs::path& model_dir) {
  std::stringstream ss;
  ss << read_input_file(model_dir / "config.json", "config file");
  Sha256 h;
  h.update(ss.str());
  return h.hex();
}

std::string checkpoint_tensor_hash(const fs::path& model_dir) {
  const Checkpoint c = Checkpoint::open(model_dir);
  Sha256 h;
  for (const auto& [name, ref] : c.tensors()) {  // std::map: sorted by name
    std::string head = name + "|" + std::string(dtype_name(ref.info->dtype)) + "|";
    for (uint64_t d : ref.info->shape)
      head += std::to_string(d) + ",";
    h.update(head);
    h.update(ref.bytes());
    ref.drop_pages();  // hashed once: a large checkpoint's pages need not stay resident
  }
  return h.hex();
}

}  // namespace qparity::golden
