#pragma once
// A bundled model (data/models/<name>), loaded once per test program and shared by its tests.
#include <map>
#include <string>

#include "chapters/01_naive_decode/llama.h"

namespace inferlab::test {

inline const models::Llama& bundled_llama(const std::string& name) {
  static std::map<std::string, models::Llama> loaded;
  auto it = loaded.find(name);
  if (it == loaded.end())
    it = loaded.emplace(name, models::load_llama(std::string(INFERLAB_DATA_DIR) + "/models/" + name)).first;
  return it->second;
}

}  // namespace inferlab::test
