// Core support: the capture-point catalog every engine and policy shares, and the cleanup of
// temporary paths on Ctrl-C.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/capture/capture_points.h"
#include "core/temp_cleanup.h"
#include "error_of.h"
#include "test_seed.h"

namespace qparity {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

TEST(CapturePoints, CatalogInExecutionOrder) {
  EXPECT_THAT(
      layer_capture_points(2, {true, false}),
      ::testing::ElementsAre("layers.2.input_norm", "layers.2.attn.qkv", "layers.2.attn.q_norm",
                             "layers.2.attn.k_norm", "layers.2.attn.rope_q", "layers.2.attn.rope_k",
                             "layers.2.attn.core", "layers.2.attn.out", "layers.2.post_attn_norm",
                             "layers.2.mlp.gate_up", "layers.2.mlp.act", "layers.2.mlp.out",
                             "layers.2.residual"));
  const auto moe = layer_capture_points(0, {false, true});
  EXPECT_EQ(moe[7], "layers.0.moe.router_logits");
  EXPECT_EQ(moe.back(), "layers.0.residual");
  EXPECT_EQ(point_layer("layers.12.attn.qkv"), 12);
  EXPECT_EQ(point_layer("logits"), -1);
  EXPECT_EQ(point_layer("layers.x.attn"), -1);
  EXPECT_EQ(point_suffix("layers.12.attn.qkv"), "attn.qkv");
  EXPECT_EQ(layer_input_point(0), "embed");
  EXPECT_EQ(layer_input_point(5), "layers.4.residual");
  EXPECT_TRUE(glob_names_a_capture_point("layers.999.moe.topk_ids"));
  EXPECT_FALSE(glob_names_a_capture_point("layers.0.mlp.gateup"));
  EXPECT_FALSE(glob_names_a_capture_point("embedding"));
}

TEST(CapturePoints, CaptureGlobsMustNameAPointOfTheModel) {
  const std::vector<std::string> points = {"embed", "layers.0.attn.qkv", "logits"};
  EXPECT_NO_THROW(check_capture_globs("embed,layers.*", points));
  EXPECT_THAT(test::error_of([&] { check_capture_globs("embed,layers.*.moe.*", points); }),
              HasSubstr("'layers.*.moe.*' matches no capture point of this model"));
  EXPECT_THAT(test::error_of([&] { check_capture_globs(",", points); }), HasSubstr("is empty"));
}

// --capture auto sizes a golden from the catalog's widths: Llama-3-8B's, worked by hand (a layer:
// 5 x 4096 for the norms, attn.out, mlp.out and residual, 6144 qkv, 2 x 4096 rope_q and core,
// 1024 rope_k, 28672 gate_up, 14336 act = 78848).
TEST(CapturePoints, AutoCaptureSizesTheGoldenFromTheCatalogWidths) {
  ModelConfig c;
  c.hidden = 4096;
  c.intermediate = 14336;
  c.num_layers = 32;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.vocab = 128256;
  EXPECT_EQ(capture_point_width(c, "layers.3.attn.qkv"), 6144);
  EXPECT_EQ(capture_point_width(c, "layers.3.mlp.gate_up"), 28672);
  EXPECT_EQ(capture_point_width(c, "layers.31.mlp.down_proj.x_values"), 14336);
  EXPECT_EQ(capture_point_width(c, "layers.3.attn.o_proj.x_scales"), -1);
  EXPECT_EQ(capture_point_width(c, "layers.32.residual"), -1);  // no such layer
  EXPECT_EQ(capture_point_width(c, "logits"), 128256);
  uint64_t full = 0;
  EXPECT_EQ(auto_capture(c, 128, 8, uint64_t{1} << 30, &full), std::string(kBoundaryCapture));
  EXPECT_EQ(full, uint64_t{128} * (78848 * 32 + 2 * 4096 + 128256) * 8);
  EXPECT_EQ(auto_capture(c, 128, 8, full), "*");
  EXPECT_EQ(auto_capture(c, 128, 8, full - 1), std::string(kBoundaryCapture));
}

// A registered temporary file is removed when the process dies of Ctrl-C (issue: an
// interrupted golden write left a hidden .NAME.tmp-PID-RAND behind).
TEST(TempCleanup, SigintRemovesRegisteredPaths) {
  const fs::path dir =
      fs::temp_directory_path() / ("qparity_cleanup_" + std::to_string(test::test_seed()));
  fs::create_directories(dir / "work" / "sub");
  std::ofstream(dir / ".golden.h5.tmp-1-2") << "half a file";
  std::ofstream(dir / "work" / "sub" / "x") << "x";
  std::ofstream(dir / "kept") << "kept";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    install_cleanup_on_signal();
    TempPathGuard tmp(dir / ".golden.h5.tmp-1-2");
    TempPathGuard work(dir / "work");
    ::raise(SIGINT);
    _exit(0);  // not reached
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT) << "dies of the signal";
  EXPECT_FALSE(fs::exists(dir / ".golden.h5.tmp-1-2"));
  EXPECT_FALSE(fs::exists(dir / "work"));
  EXPECT_TRUE(fs::exists(dir / "kept"));
  {  // A guard that is released keeps its path; one set to remove it does so on any exit.
    std::ofstream(dir / "a") << "a";
    { TempPathGuard g(dir / "a", TempPathGuard::OnExit::kRemove); }
    EXPECT_FALSE(fs::exists(dir / "a"));
    std::ofstream(dir / "b") << "b";
    {
      TempPathGuard g(dir / "b", TempPathGuard::OnExit::kRemove);
      g.release();
    }
    EXPECT_TRUE(fs::exists(dir / "b"));
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace qparity
