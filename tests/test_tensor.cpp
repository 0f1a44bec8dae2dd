// Tensor basics and the 16-bit float conversions.
#include <cmath>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "common/tensor.h"
#include "test_util.h"

namespace inferlab {
namespace {

using test::expect_error;

TEST(Tensor, ShapeStridesAndContiguity) {
  Tensor t = Tensor::zeros({2, 3, 4}, DType::F32);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.ndim(), 3);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.strides(), (std::vector<std::int64_t>{12, 4, 1}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_EQ(t.describe(), "f32[2, 3, 4] cpu");
  for (std::int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t.data<float>()[i], 0.0f);
}

TEST(Tensor, SliceSelectViewShareBytes) {
  std::vector<float> v(24);
  for (int i = 0; i < 24; ++i) v[i] = static_cast<float>(i);
  Tensor t = Tensor::from_vector(v, {2, 3, 4});
  Tensor s = t.slice(1, 1, 3);  // [2, 2, 4], strided
  EXPECT_EQ(s.shape(), (Shape{2, 2, 4}));
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_EQ(s.at<float>({1, 0, 2}), 18.0f);  // t[1, 1, 2] = 12 + 4 + 2
  Tensor c = s.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.to_float_vector()[4], 8.0f);  // s[0, 1, 0] = t[0, 2, 0]
  Tensor row = t.select(0, 1);
  EXPECT_EQ(row.shape(), (Shape{3, 4}));
  EXPECT_EQ(row.at<float>({0, 0}), 12.0f);
  row.at<float>({0, 0}) = -1.0f;  // a view writes through
  EXPECT_EQ(t.at<float>({1, 0, 0}), -1.0f);
  Tensor flat = t.view({-1, 4});
  EXPECT_EQ(flat.shape(), (Shape{6, 4}));
  Tensor cl = t.clone();
  cl.at<float>({0, 0, 0}) = 99.0f;  // a clone does not
  EXPECT_EQ(t.at<float>({0, 0, 0}), 0.0f);
}

TEST(Tensor, ClearErrors) {
  Tensor t = Tensor::zeros({2, 3}, DType::F32);
  expect_error([&] { t.view({4, 2}); }, {"cannot view", "[4, 2]"});
  expect_error([&] { t.slice(1, 2, 5); }, {"slice", "out of range"});
  expect_error([&] { t.size(2); }, {"dimension 2 out of range"});
  expect_error([&] { t.data<std::int32_t>(); }, {"f32[2, 3]"});
  expect_error([&] { t.slice(1, 0, 2).view({4}); }, {"not contiguous"});
  expect_error([&] { Tensor::from_vector(std::vector<float>(5), {2, 3}); }, {"5 values", "[2, 3]"});
  expect_error([&] { Tensor::empty({2, -1}, DType::F32); }, {"negative dimension"});
  Tensor u = Tensor::zeros({3, 2}, DType::F32);
  expect_error([&] { u.copy_from(t); }, {"copy_from", "[2, 3]"});
}

TEST(Tensor, BoundsCheckedInDebugBuilds) {
#ifdef NDEBUG
  GTEST_SKIP() << "at() checks bounds only in debug builds (NDEBUG is set in this build)";
#else
  Tensor t = Tensor::zeros({2, 3}, DType::F32);
  expect_error([&] { t.at<float>({2, 0}); }, {"index 2 out of range", "dimension 0"});
  expect_error([&] { t.at<float>({0}); }, {"1 indices"});
  expect_error([&] { t.at<double>({0, 0}); }, {"f32"});
#endif
}

TEST(Tensor, CudaWithoutDeviceIsAClearError) {
  const std::string reason = cuda::unavailable_reason();
  if (reason.empty()) GTEST_SKIP() << "a CUDA device is available; this test checks the message when there is none";
  expect_error([] { Tensor::empty({4}, DType::F32, Device::CUDA); }, {"no CUDA device available: ", reason});
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xC000);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1 + 2^-7: ties go to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f), 0x3F80);
  // 1 + 3·2^-8 is halfway between 1 + 2^-7 (odd mantissa) and 1 + 2^-6: goes to 1 + 2^-6.
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);  // above halfway rounds up
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::infinity())), std::numeric_limits<float>::infinity());
}

TEST(DType, Bf16EveryPatternRoundTrips) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const float f = bf16_to_f32(static_cast<std::uint16_t>(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_bf16(f), b) << "bf16 pattern " << b;
  }
}

TEST(DType, F16KnownValuesAndEveryPatternRoundTrips) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3C00);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);  // largest finite
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);  // halfway to the next binade: rounds to infinity
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);  // halfway to zero: ties to even
  EXPECT_EQ(f16_to_f32(0xC000), -2.0f);
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), h) << "f16 pattern " << h;
  }
}

TEST(Tensor, DtypeConversions) {
  Tensor t = Tensor::from_vector(std::vector<float>{1.0f, -0.5f, 3.140625f}, {3});
  for (DType d : {DType::F16, DType::BF16, DType::F64}) {
    Tensor c = t.to(d);
    EXPECT_EQ(c.dtype(), d);
    EXPECT_EQ(c.to_float_vector(), t.to_float_vector()) << dtype_name(d);  // all exactly representable
  }
  Tensor i = Tensor::from_vector(std::vector<std::int64_t>{1, -7, 300}, {3});
  EXPECT_EQ(i.to(DType::I32).data<std::int32_t>()[2], 300);
  expect_error([&] { t.to(DType::I32); }, {"cannot convert"});
}

// with_context is how the few places that know what is being worked on (a file and tensor, a
// generated token, a cache) put that into errors raised deep inside: a conversion, the sampler,
// an allocation. It used to be each check's job, and most could not know.
TEST(Errors, WithContextSaysWhereAndTurnsRunningOutOfMemoryIntoAnError) {
  const Tensor i = Tensor::from_vector(std::vector<std::int32_t>{1, 2}, {2});
  expect_error([&] { with_context("model.safetensors: tensor 'w'", [&] { return i.to(DType::F32); }); },
               {"model.safetensors: tensor 'w': to(): cannot convert i32 to f32"});
  // A message that already names the place is not prefixed twice.
  try {
    with_context("f.bin: tensor x", [] { fail("f.bin: tensor x: element [0] is nan"); });
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "f.bin: tensor x: element [0] is nan");
  }
  // `where` may be a callable, called only when something fails; the result passes through.
  int calls = 0;
  EXPECT_EQ(with_context(
                [&] {
    ++calls;
    return std::string("never");
                },
                [] { return 7; }),
            7);
  EXPECT_EQ(calls, 0);
  expect_error([] { with_context("KV cache of 9 positions", []() -> int { throw std::bad_alloc(); }); },
               {"KV cache of 9 positions: out of host memory"});
  expect_error(
      [] {
    with_context("tokenizer.bin", [] {
      std::vector<char> v;
      v.reserve(v.max_size() + 1);  // std::length_error, without allocating anything
    });
      },
      {"tokenizer.bin: out of host memory"});
}

#if defined(__SANITIZE_ADDRESS__)
#define IL_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define IL_UNDER_ASAN 1
#endif
#endif

TEST(Errors, AFailedAllocationSaysWhatTensorItWasFor) {
#ifdef IL_UNDER_ASAN
  GTEST_SKIP() << "AddressSanitizer aborts on an allocation of 2^62 bytes instead of returning null";
#else
  // 2^62 bytes: beyond any address space, so it fails whatever the overcommit policy.
  expect_error([] { Tensor::empty({std::int64_t{1} << 60}, DType::F32); },
               {"out of host memory allocating 4611686018427387904 bytes", "[1152921504606846976] f32 tensor"});
#endif
}

}  // namespace
}  // namespace inferlab
