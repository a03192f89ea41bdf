#pragma once
// The capture-point catalog (capture_points.h) written out for the places outside C++ that need
// it, so that none of them keeps a copy of its own: the Python dump helper's module
// (python/qparity_dump/_points.py) and golden/SCHEMA.md's table of points. `qparity catalog`
// prints both; tests keep the committed files equal to what this generates.
#include <string>

namespace qparity {

// A Python module: BEFORE_LAYERS, AFTER_LAYERS, LAYER_SUFFIXES (every suffix in execution
// order, activation-code leaves included), CODE_LINEARS, CODE_LEAVES and LAYER_POINTS (a layer's
// suffixes for each (qk_norm, moe, quantized_kv_cache, linear_attention, attn_gate) shape, as
// layer_capture_points gives them).
std::string catalog_python_module();

// A Markdown table: every point in execution order, the layers that have it and its values per
// token. Throws naming the suffix when a point of the catalog has no row here (the rows'
// descriptions live beside the generator, checked against the catalog on every call).
std::string catalog_markdown_table();

}  // namespace qparity
