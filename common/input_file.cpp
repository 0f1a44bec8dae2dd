#include "common/input_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"

namespace inferlab {

void require_regular_file(const std::string& path, const std::string& what) {
  struct stat st {};
  IL_CHECK(::stat(path.c_str(), &st) == 0, "cannot open ", what, " ", path, ": ", std::strerror(errno));
  if (S_ISREG(st.st_mode)) return;
  const char* kind = S_ISFIFO(st.st_mode)                         ? "a FIFO (named pipe)"
                     : S_ISDIR(st.st_mode)                        ? "a directory"
                     : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                     : S_ISSOCK(st.st_mode)                       ? "a socket"
                                                                  : "a special file";
  fail("cannot open ", what, " ", path, ": it is ", kind, ", not a regular file");
}

}  // namespace inferlab
