// Chapter 07 on the GPU: the chunked scan kernel (prefill) and the fused step kernel (decode)
// against the float64 recurrence, and a whole model on CUDA against the CPU (skipped, with the
// driver's reason, without a GPU).
#include <gtest/gtest.h>

#include "mamba_bound.h"
#include "scan_oracle.h"

namespace inferlab {
namespace {

models::mamba::ScanInputs on_gpu(const models::mamba::ScanInputs& in, std::vector<Tensor>& keep) {
  auto up = [&](const Tensor& t) {
    keep.push_back(t.contiguous().to(Device::CUDA));
    return keep.back();
  };
  models::mamba::ScanInputs g = in;
  g.u = up(in.u), g.dt = up(in.dt), g.A = up(in.A), g.B = up(in.B), g.C = up(in.C), g.D = up(in.D), g.z = up(in.z);
  return g;
}

TEST(CudaMamba, ChunkedScanAndStepKernelMatchTheFloat64Recurrence) {
  IL_REQUIRE_CUDA();
  auto rng = test::rng_for_test();
  for (const bool lti : {false, true})
    for (const auto [T, E, N] :
         std::vector<std::array<std::int64_t, 3>>{{1, 7, 16}, {3, 5, 4}, {300, 9, 16}, {517, 4, 24}, {64, 3, 64}}) {
      SCOPED_TRACE((lti ? "LTI" : "selective") + std::string(", T ") + std::to_string(T) + ", E " + std::to_string(E) +
                   ", N " + std::to_string(N));
      const auto r = test::random_scan(rng, T, E, N, lti);
      const auto h0 = test::random_state(rng, E, N);
      const auto want = test::scan_oracle(r.in, h0);
      std::vector<Tensor> keep;
      const models::mamba::ScanInputs g = on_gpu(r.in, keep);
      Tensor h = test::state_tensor(h0, E, N).to(Device::CUDA), y = Tensor::empty({T, E}, DType::F32, Device::CUDA);
      models::mamba::selective_scan(g, h, y);  // T > 1: the chunked kernel; T = 1: the step kernel
      test::expect_within(y.to(Device::CPU).to_double_vector(), want.y, test::scan_bound(want.y_scale, T, N), "y");
      test::expect_within(h.to(Device::CPU).to_double_vector(), want.h, test::scan_bound(want.h_scale, T, N), "state");
    }
}

TEST(CudaMamba, PrefillAndDecodeMatchTheCpu) {
  IL_REQUIRE_CUDA();
  auto rng = test::rng_for_test();
  models::mamba::MambaConfig c;
  c.architecture = "MambaForCausalLM";
  c.hidden_size = 48, c.inner_size = 96, c.state_size = 16, c.conv_kernel = 4, c.dt_rank = 3, c.num_layers = 3;
  c.vocab_size = 101;
  const models::mamba::MambaModel cpu = models::mamba::random_mamba(c, rng());
  const models::mamba::MambaModel gpu = cpu.to(Device::CUDA);
  const auto tokens = test::random_tokens(rng, 200, c.vocab_size);
  models::mamba::MambaState on_cpu(c), on_gpu(c, Device::CUDA);
  EXPECT_EQ(on_gpu.bytes(), on_cpu.bytes());
  const std::vector<std::int32_t> prompt(tokens.begin(), tokens.begin() + 170);
  auto want = models::mamba::forward_cached(cpu, on_cpu, prompt, true).to_double_vector();
  auto got = models::mamba::forward_cached(gpu, on_gpu, prompt, true).to(Device::CPU).to_double_vector();
  for (std::size_t i = 170; i < tokens.size(); ++i) {
    const auto a = models::mamba::forward_cached(cpu, on_cpu, {tokens[i]}).to_double_vector();
    const auto b = models::mamba::forward_cached(gpu, on_gpu, {tokens[i]}).to(Device::CPU).to_double_vector();
    want.insert(want.end(), a.begin(), a.end()), got.insert(got.end(), b.begin(), b.end());
  }
  EXPECT_LE(test::max_diff(got, want), test::two_path_bound(test::bound_config(c, 200), want));
  for (std::int64_t l = 0; l < c.num_layers; ++l)
    EXPECT_LE(test::max_diff(on_gpu.ssm(l).to(Device::CPU).to_double_vector(), on_cpu.ssm(l).to_double_vector()),
              test::two_path_bound(test::bound_config(c, 200), on_cpu.ssm(l).to_double_vector()));
}

}  // namespace
}  // namespace inferlab
