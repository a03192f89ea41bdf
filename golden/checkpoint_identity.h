#pragma once
// What names a checkpoint in a golden or a candidate: its directory's name, the sha256 of its
// config.json and of its tensors. Every producer (the reference, the GPU engine, a C++ or Python
// candidate writer) records the same three, so compare can tell that two dumps ran one checkpoint.
#include <filesystem>
#include <string>

#include "schemes/description/quant_plan.h"

namespace qparity::golden {

// A name for the model in `model_dir`: the directory's name ("ckpt" for "runs/ckpt/").
std::string model_name(const std::filesystem::path& model_dir);

// The scheme id(s) a plan applies ("fp8-block", "w8a8-static+kv-int8"; "bf16" when none).
std::string plan_scheme(const QuantPlan& plan);
// The scheme of the checkpoint in `model_dir` by its own quantization config (what a candidate
// of it is judged by).
std::string checkpoint_scheme(const std::filesystem::path& model_dir);

// sha256 of config.json's bytes, and of the checkpoint's tensors (for each, sorted by name: the
// name, dtype, shape and bytes), so a golden names exactly the weights it came from.
std::string config_hash(const std::filesystem::path& model_dir);
std::string checkpoint_tensor_hash(const std::filesystem::path& model_dir);

}  // namespace qparity::golden
