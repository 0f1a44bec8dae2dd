// The tokenizer file formats that Tokenizer::load and for_model know besides tokenizer.json.
// A new format adds its module's entry here.
#include "common/gguf_tokenizer.h"
#include "common/llama2c.h"
#include "common/tokenizer.h"

namespace inferlab {

std::span<const TokenizerFormat> tokenizer_formats() {
  static const TokenizerFormat formats[] = {llama2c_tokenizer_format(), gguf::tokenizer_format()};
  return formats;
}

}  // namespace inferlab
