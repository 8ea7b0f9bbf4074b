#include "src/stats/perf_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

namespace flare::stats {
namespace {

std::string nameOf(const char* cuda) {
  const DevicePeak* d = PeakTable::builtin().find(cuda);
  return d ? d->name : "(none)";
}

TEST(PeakTable, FindsDevicesByTheNameCudaReports) {
  EXPECT_EQ(nameOf("NVIDIA H100 80GB HBM3"), "H100 SXM");
  EXPECT_EQ(nameOf("NVIDIA H100 PCIe"), "H100 PCIe");
  EXPECT_EQ(nameOf("NVIDIA H200"), "H200");
  EXPECT_EQ(nameOf("NVIDIA H20"), "H20");  // not H200
  EXPECT_EQ(nameOf("NVIDIA H800"), "H800");
  EXPECT_EQ(nameOf("NVIDIA A100-SXM4-80GB"), "A100 80GB");
  EXPECT_EQ(nameOf("NVIDIA A100-SXM4-40GB"), "A100 40GB");
  EXPECT_EQ(nameOf("NVIDIA A100 80GB PCIe"), "A100 80GB PCIe");
  EXPECT_EQ(nameOf("NVIDIA A800-SXM4-80GB"), "A800");
  EXPECT_EQ(nameOf("NVIDIA B200"), "B200");
  EXPECT_EQ(nameOf("NVIDIA L40S"), "L40S");
  EXPECT_EQ(nameOf("Tesla V100-SXM2-16GB"), "(none)");
  const DevicePeak* h100 = PeakTable::builtin().find("NVIDIA H100 80GB HBM3");
  ASSERT_NE(h100, nullptr);
  EXPECT_DOUBLE_EQ(h100->peakTflops(Dtype::kBf16), 989.4);
  EXPECT_DOUBLE_EQ(h100->peakTflops(Dtype::kFp8), 1978.9);
  EXPECT_EQ(h100->smCount, 132);
  EXPECT_EQ(PeakTable::builtin().find("NVIDIA A100-SXM4-80GB")->peakTflops(Dtype::kFp8), 0);
}

TEST(PeakTable, ConfigurableEntryOverrides) {
  std::string error;
  const auto capped = parseDevicePeak(
      "H100 capped:bf16=700,fp8=1400,mem_gbps=3350,sms=132,match=h100 hbm3", &error);
  ASSERT_TRUE(capped) << error;
  PeakTable t = PeakTable::builtin();
  t.add(*capped);
  EXPECT_EQ(t.find("NVIDIA H100 80GB HBM3")->name, "H100 capped");
  EXPECT_EQ(t.find("NVIDIA H100 PCIe")->name, "H100 PCIe");  // no "hbm3"
  const auto custom = parseDevicePeak("MI300X:bf16=1307,mem_gbps=5300,sms=304", &error);
  ASSERT_TRUE(custom) << error;
  t.add(*custom);
  EXPECT_EQ(t.find("AMD Instinct MI300X")->peakTflops(Dtype::kBf16), 1307);
  for (const char* bad : {"", "nocolon", ":bf16=1", "X:bf16", "X:bf16=abc", "X:bf16=-1", "X:sms=4",
                          "X:bf16=1,sms=0", "X:bf16=1,color=3", "X:mem_gbps=5"}) {
    error.clear();
    EXPECT_FALSE(parseDevicePeak(bad, &error)) << bad;
    EXPECT_FALSE(error.empty()) << bad;
  }
}

TEST(Formulas, FlopsAndBandwidth) {
  EXPECT_DOUBLE_EQ(gemmFlops(2, 4096, 4096, 4096), 2.0 * 2 * 4096.0 * 4096 * 4096);
  const double fwd = 4.0 * 1 * 2048 * 2048 * 32 * 128;
  EXPECT_DOUBLE_EQ(attentionFlops(1, 2048, 2048, 32, 128, false, false), fwd);
  EXPECT_DOUBLE_EQ(attentionFlops(1, 2048, 2048, 32, 128, true, false), fwd / 2);
  EXPECT_DOUBLE_EQ(attentionFlops(1, 2048, 2048, 32, 128, true, true), fwd / 2 * 2.5);
  EXPECT_DOUBLE_EQ(tflops(2e12, 0.5), 4);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(Collective::kAllReduce, 8), 1.75);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(Collective::kAllGather, 8), 0.875);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(Collective::kReduceScatter, 4), 0.75);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(Collective::kAllToAll, 2), 0.5);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(Collective::kBroadcast, 8), 1);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(Collective::kReduce, 8), 1);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(Collective::kSendRecv, 2), 1);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(Collective::kAllReduce, 1), 0);
  EXPECT_DOUBLE_EQ(algBandwidth(1e9, 0.01), 1e11);
  EXPECT_DOUBLE_EQ(busBandwidth(Collective::kAllReduce, 8, 1e9, 0.01), 1.75e11);
  EXPECT_EQ(busBandwidth(Collective::kAllReduce, 8, 1e9, 0), 0);
  EXPECT_EQ(parseCollective("reducescatter"), Collective::kReduceScatter);
  EXPECT_FALSE(parseCollective("gossip"));
}

TEST(Alignment, HintNamesTheDimensionAndTheNearestAlignedValue) {
  EXPECT_TRUE(gemmAlignmentIssues(4096, 4096, 4096, 2).empty());
  auto issues = gemmAlignmentIssues(4096, 4096, 4095, 2);  // bf16: 64 elements per 128 bytes
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].dim, 'k');
  EXPECT_EQ(issues[0].bytes, 8190);
  EXPECT_EQ(issues[0].aligned, 4096);
  issues = gemmAlignmentIssues(100, 96, 100, 4);  // fp32: 32 elements; 100 → 96 (4 < 28)
  ASSERT_EQ(issues.size(), 2u);
  EXPECT_EQ(issues[0].dim, 'm');
  EXPECT_EQ(issues[0].aligned, 96);
  EXPECT_EQ(issues[1].dim, 'k');
  issues = gemmAlignmentIssues(128, 128, 100, 1);  // fp8: 128 elements; never rounds to 0
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].aligned, 128);
  const std::string hint = gemmAlignmentHint(4096, 4096, 4095, Dtype::kBf16);
  EXPECT_NE(hint.find("k=4095 (8190 bytes in bf16)"), std::string::npos) << hint;
  EXPECT_NE(hint.find("nearest aligned k=4096"), std::string::npos) << hint;
  EXPECT_EQ(gemmAlignmentHint(4096, 4096, 4096, Dtype::kBf16), "");
}

TEST(GemmModel, ExpectedTflopsByHand) {
  const DevicePeak& h100 = *PeakTable::builtin().find("NVIDIA H100 80GB HBM3");
  // 8192³ bf16: 64·64 = 4096 tiles over 132 SMs = 32 waves → 4096/4224; compute-bound.
  auto e = expectedGemm(h100, Dtype::kBf16, 1, 8192, 8192, 8192);
  EXPECT_DOUBLE_EQ(e.tileEfficiency, 1);
  EXPECT_NEAR(e.waveEfficiency, 4096.0 / 4224, 1e-12);
  EXPECT_NEAR(e.expectedTflops, 989.4 * 0.75 * 4096 / 4224, 1e-9);
  EXPECT_FALSE(e.memoryBound);
  // k = 64: arithmetic intensity 2·8192²·64 / (2·(2·8192·64 + 8192²)) = 8192·64/8320 FLOP/B
  // × 3.35 TB/s = 211 TFLOPS < 720: memory-bound.
  e = expectedGemm(h100, Dtype::kBf16, 1, 8192, 8192, 64);
  EXPECT_TRUE(e.memoryBound);
  EXPECT_NEAR(e.expectedTflops, 8192.0 * 64 / 8320 * 3350e9 / 1e12, 1e-9);
  // One tile: 1/132 of the SMs busy.
  e = expectedGemm(h100, Dtype::kBf16, 1, 128, 128, 128);
  EXPECT_NEAR(e.expectedTflops, 989.4 * 0.75 / 132, 1e-9);
  // m = 100: tile efficiency 100/128; k misaligned (4095): halved.
  e = expectedGemm(h100, Dtype::kBf16, 132, 100, 128, 4096);
  EXPECT_NEAR(e.tileEfficiency, 100.0 / 128, 1e-12);
  EXPECT_DOUBLE_EQ(e.waveEfficiency, 1);
  e = expectedGemm(h100, Dtype::kBf16, 1, 8192, 8192, 4095);
  EXPECT_DOUBLE_EQ(e.alignEfficiency, 0.5);
  // 256×128 tiles: 32·64 = 2048 tiles → 16 waves of 132 = 2112.
  e = expectedGemm(h100, Dtype::kBf16, 1, 8192, 8192, 8192, {256, 128, 0.75, 0.5});
  EXPECT_NEAR(e.waveEfficiency, 2048.0 / 2112, 1e-12);
  // Unsupported dtype or empty shape.
  const DevicePeak& a100 = *PeakTable::builtin().find("NVIDIA A100-SXM4-80GB");
  EXPECT_EQ(expectedGemm(a100, Dtype::kFp8, 1, 4096, 4096, 4096).expectedTflops, 0);
  EXPECT_EQ(expectedGemm(h100, Dtype::kBf16, 1, 0, 4096, 4096).expectedTflops, 0);
}

}  // namespace
}  // namespace flare::stats
