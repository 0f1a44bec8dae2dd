#include "common/json_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>

namespace inferlab {

nlohmann::json load_json(const std::string& path) {
  std::ifstream in(path);
  IL_CHECK(in.good(), "cannot open ", path, ": ", std::strerror(errno));
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": not valid JSON: ", e.what());
  }
}

}  // namespace inferlab
