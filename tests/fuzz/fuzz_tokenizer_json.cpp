// A tokenizer.json: loaded, then used to encode and decode a fixed text.
#include "common/tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace inferlab;
  fuzz::write_input(data, size, "tokenizer.json");
  fuzz::expect_clean([] {
    const HfTokenizer tok = HfTokenizer::load(fuzz::work_dir());
    const auto ids = tok.encode("Once upon a time, Émile ate 12 crêpes.\n\n<|endoftext|> 🍰");
    tok.decode(ids);
    for (std::int32_t id = 0; id < tok.vocab_size() && id < 64; ++id) tok.id_to_token(id);
  });
  return 0;
}
