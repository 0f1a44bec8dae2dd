// A GGUF file: metadata, tensor table, its tokenizer, and the model chapter 09 assembles from it.
#include "chapters/01_naive_decode/generate.h"
#include "chapters/09_quantization/gguf_model.h"
#include "common/gguf.h"
#include "common/gguf_tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace inferlab;
  const std::string path = fuzz::write_input(data, size, "model.gguf");
  fuzz::expect_clean([&] {
    const gguf::File f(path);
    for (const auto& t : f.tensors()) f.raw(t.name);
    if (f.has("tokenizer.ggml.model")) gguf::tokenizer(f)->encode("Once upon a time");
    gguf::stop_ids(f);
    const models::Llama m = ch09::load_gguf(f);
    ch01::forward(m, {0});
  });
  return 0;
}
