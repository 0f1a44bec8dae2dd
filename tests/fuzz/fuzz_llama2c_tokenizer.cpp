// A llama2.c tokenizer.bin: loaded, then used to encode and decode a fixed text.
#include "common/llama2c.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace inferlab;
  const std::string path = fuzz::write_input(data, size, "tokenizer.bin");
  fuzz::expect_clean([&] {
    const Llama2cTokenizer tok = Llama2cTokenizer::load(path);
    tok.decode(tok.encode("Once upon a time, there was a cat. 🍰"));
  });
  return 0;
}
