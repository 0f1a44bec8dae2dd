#include "common/json_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "common/input_file.h"

namespace inferlab {

nlohmann::json load_json(const std::string& path) {
  require_regular_file(path, "JSON file");
  std::ifstream in(path);
  IL_CHECK(in.good(), "cannot open ", path, ": ", std::strerror(errno));
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": not valid JSON: ", e.what());
  }
}

}  // namespace inferlab
