// A GGUF file: metadata, tensor table, and the model chapter 09 assembles from it.
#include "chapters/09_quantization/gguf_model.h"
#include "common/gguf.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace inferlab;
  const std::string path = fuzz::write_input(data, size, "model.gguf");
  fuzz::expect_clean([&] {
    const gguf::File f(path);
    for (const auto& t : f.tensors()) f.raw(t.name);
    const ch01::Llama m = ch09::load_gguf(f);
    ch01::forward(m, {0});
  });
  return 0;
}
