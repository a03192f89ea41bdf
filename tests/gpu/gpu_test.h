#pragma once
#include <gtest/gtest.h>

#include "gpu_engine/device_info.h"

namespace qparity::test {

// Base fixture: skips, saying why, when no CUDA device is usable (CI has the toolkit, no GPU).
class GpuTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    auto d = gpu::query_device(0, &why);
    if (!d) GTEST_SKIP() << why;
    device_ = *d;
  }
  gpu::DeviceInfo device_;
};

}  // namespace qparity::test
