// A model.safetensors file: the header, the offsets, every tensor's bytes.
#include "common/safetensors.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace inferlab;
  fuzz::write_input(data, size, "model.safetensors");
  fuzz::expect_clean([] {
    const Checkpoint ck(fuzz::work_dir());
    for (const std::string& name : ck.names()) {
      const Tensor t = ck.get(name);
      if (t.numel() > 0 && t.numel() < (1 << 16) && is_float(t.dtype())) t.to_double_vector();
    }
  });
  return 0;
}
