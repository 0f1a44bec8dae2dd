// The one weight type: a Linear holds a plain tensor or a packed matrix (and a bias), and
// linear() dispatches on which; a LinearHook watches what the layers are fed.
#include <gtest/gtest.h>

#include "common/linear.h"
#include "common/ops.h"
#include "test_util.h"

namespace inferlab {
namespace {

// A "packed" format that stores W as doubles and counts its products: enough to see that
// linear() calls the packed matrix, not ops::matmul.
class DoubleMatrix : public PackedMatrix {
 public:
  explicit DoubleMatrix(const Tensor& w) : w_(w.to_double_vector()), n_(w.size(0)), k_(w.size(1)) {}
  void matmul(const Tensor& x, Tensor& out) const override {
    ++calls;
    for (std::int64_t m = 0; m < x.size(0); ++m)
      for (std::int64_t n = 0; n < n_; ++n) {
        double s = 0;
        for (std::int64_t k = 0; k < k_; ++k) s += w_[static_cast<std::size_t>(n * k_ + k)] * x.at<float>({m, k});
        out.at<float>({m, n}) = static_cast<float>(s);
      }
  }
  std::int64_t out_features() const override { return n_; }
  std::int64_t in_features() const override { return k_; }
  std::int64_t bytes() const override { return n_ * k_ * 8; }
  Device device() const override { return Device::CPU; }
  std::shared_ptr<const PackedMatrix> to_device(Device) const override { return std::make_shared<DoubleMatrix>(*this); }
  std::string format() const override { return "f64"; }
  mutable int calls = 0;

 private:
  std::vector<double> w_;
  std::int64_t n_, k_;
};

TEST(Linear, PlainAndPackedWeightsGiveTheSameProductPlusBias) {
  auto rng = test::rng_for_test();
  const Tensor x = test::uniform(rng, {3, 40}), w = test::uniform(rng, {24, 40}), b = test::uniform(rng, {24});
  const Linear plain(w, b);
  auto packed_matrix = std::make_shared<DoubleMatrix>(w);
  const Linear packed(packed_matrix, b);
  EXPECT_EQ(plain.out_features(), 24);
  EXPECT_EQ(packed.in_features(), 40);
  EXPECT_EQ(plain.bytes(), 24 * 40 * 4 + 24 * 4);
  EXPECT_EQ(packed.bytes(), 24 * 40 * 8 + 24 * 4);
  const auto a = linear(x, plain).to_double_vector(), c = linear(x, packed).to_double_vector();
  EXPECT_EQ(packed_matrix->calls, 1);
  // Against x·Wᵀ + b in float64, from the definition.
  for (std::int64_t m = 0; m < 3; ++m)
    for (std::int64_t n = 0; n < 24; ++n) {
      double want = b.at<float>({n});
      for (std::int64_t k = 0; k < 40; ++k) want += static_cast<double>(x.at<float>({m, k})) * w.at<float>({n, k});
      const std::size_t i = static_cast<std::size_t>(m * 24 + n);
      EXPECT_NEAR(a[i], want, test::gamma(41) * 41) << i;
      EXPECT_NEAR(c[i], want, 1e-6) << i;
    }
  // Conversions keep the bias in f32 and a packed matrix packed.
  const Linear half = plain.to(Device::CPU, DType::BF16);
  EXPECT_EQ(half.weight.dtype(), DType::BF16);
  EXPECT_EQ(half.bias.dtype(), DType::F32);
  EXPECT_EQ(packed.to(Device::CPU, DType::BF16).packed->format(), "f64");
  test::expect_error([&] { linear(x, Linear{}); }, {"linear", "no weight"});
}

TEST(Linear, LayersSharingAnInputGiveWhatEachGivesAlone) {
  auto rng = test::rng_for_test();
  const Tensor x = test::uniform(rng, {3, 40});
  const Linear q(test::uniform(rng, {24, 40}), test::uniform(rng, {24})), k(test::uniform(rng, {8, 40}));
  const Linear v(std::make_shared<DoubleMatrix>(test::uniform(rng, {8, 40})), test::uniform(rng, {8}));
  for (const std::vector<const Linear*>& ls : {std::vector<const Linear*>{&q, &k}, {&q, &k, &v}}) {  // plain; one packed
    std::vector<const Linear*> seen;
    const LinearHook hook([&](const Linear& l, const Tensor& in) {
      EXPECT_EQ(in.data<float>(), x.data<float>());
      seen.push_back(&l);
    });
    const std::vector<Tensor> outs = linears(x, ls);
    ASSERT_EQ(outs.size(), ls.size());
    EXPECT_EQ(seen, ls);  // the hook sees each layer once
    for (std::size_t j = 0; j < ls.size(); ++j)
      EXPECT_EQ(outs[j].to_double_vector(), linear(x, *ls[j]).to_double_vector()) << "layer " << j;
  }
  const Linear none;
  test::expect_error([&] { linears(x, {&q, &none}); }, {"linears", "no weight"});
}

TEST(Linear, HooksSeeEveryInputInnermostFirst) {
  auto rng = test::rng_for_test();
  const Tensor x = test::uniform(rng, {2, 8});
  const Linear a(test::uniform(rng, {4, 8})), b(test::uniform(rng, {8, 4}));
  std::vector<std::string> seen;
  {
    const LinearHook outer([&](const Linear& l, const Tensor& in) { seen.push_back(&l == &a ? "outer a" : "outer b"); });
    linear(linear(x, a).view({2, 4}), b);
    {
      const LinearHook inner([&](const Linear& l, const Tensor& in) {
        EXPECT_EQ(in.size(1), l.in_features());
        seen.push_back(&l == &a ? "inner a" : "inner b");
      });
      linear(x, a);
    }
    linear(x, a);  // the outer hook again once the inner one has ended
  }
  linear(x, a);  // no hook: nothing recorded
  EXPECT_EQ(seen, (std::vector<std::string>{"outer a", "outer b", "inner a", "outer a"}));
}

}  // namespace
}  // namespace inferlab
