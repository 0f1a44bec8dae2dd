// The GGUF block decoders on arbitrary bytes: the first byte picks a block type, the second the
// rows (1-4); the rest, cut to whole blocks, is the rows' packed data. Each is decoded by the
// reference decoder (gguf::dequantize_rows), then as chapter 09 runs it: the loader's scale
// check, dequantize, and the packed product and its reference; the one-block decoder must agree
// with the row decoder. (Of the IQ types only IQ4_NL and IQ4_XS have a decoder here: a GGUF of the
// others is refused by name, which the gguf target reaches.)
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "chapters/09_quantization/quant.h"
#include "common/gguf.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace inferlab;
  using ch09::Format;
  struct Kind {
    gguf::Type type;
    Format format;
  };
  static const Kind kinds[] = {
      {gguf::Type::Q4_0, Format::Q4_0}, {gguf::Type::Q4_1, Format::Q4_1},     {gguf::Type::Q5_0, Format::Q5_0},
      {gguf::Type::Q5_1, Format::Q5_1}, {gguf::Type::Q8_0, Format::Q8_0},     {gguf::Type::Q2_K, Format::Q2_K},
      {gguf::Type::Q3_K, Format::Q3_K}, {gguf::Type::Q4_K, Format::Q4_K},     {gguf::Type::Q5_K, Format::Q5_K},
      {gguf::Type::Q6_K, Format::Q6_K}, {gguf::Type::IQ4_NL, Format::IQ4_NL}, {gguf::Type::IQ4_XS, Format::IQ4_XS}};
  if (size < 2) return 0;
  const Kind k = kinds[data[0] % (sizeof kinds / sizeof kinds[0])];
  const std::int64_t rows = 1 + data[1] % 4;
  data += 2, size -= 2;
  const std::int64_t block = gguf::block_values(k.type), block_bytes = gguf::row_bytes(k.type, block);
  const std::int64_t blocks = static_cast<std::int64_t>(size) / (rows * block_bytes);
  if (blocks == 0) return 0;
  const std::int64_t cols = blocks * block, stride = blocks * block_bytes;
  Tensor raw = Tensor::empty({rows, stride}, DType::U8);
  std::memcpy(raw.data<std::uint8_t>(), data, static_cast<std::size_t>(rows * stride));
  fuzz::expect_clean([&] {
    const Tensor ref = gguf::dequantize_rows(k.type, raw, cols);
    std::vector<float> one(static_cast<std::size_t>(block));
    gguf::dequantize_block(k.type, raw.data<std::uint8_t>(), one.data());
    for (std::int64_t i = 0; i < block; ++i) {
      const float a = one[static_cast<std::size_t>(i)], b = ref.data<float>()[i];
      if (a != b && !(std::isnan(a) && std::isnan(b))) std::abort();  // the two decoders disagree
    }
    ch09::check_block_scales(raw, k.format, "fuzz");
    const ch09::QMatrix q(ch09::QuantSpec{k.format}, rows, cols, raw.clone());
    ch09::dequantize(q);
    Tensor x = Tensor::empty({2, cols}, DType::F32);
    for (std::int64_t i = 0; i < 2 * cols; ++i) x.data<float>()[i] = static_cast<float>(i % 7) - 3.0f;
    Tensor out = Tensor::empty({2, rows}, DType::F32), out_ref = Tensor::empty({2, rows}, DType::F32);
    ch09::qmatmul(x, q, out);
    ch09::qmatmul_ref(x, q, out_ref);
  });
  return 0;
}
