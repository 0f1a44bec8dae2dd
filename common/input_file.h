#pragma once
/// @file input_file.h
/// @brief The check every reader runs before it opens a file the user named.

#include <string>

namespace inferlab {

/// Throws "cannot open <what> <path>: ..." unless `path` is a regular file (links followed).
/// Opening a FIFO blocks until something writes to it, and a directory or a device fails deep
/// inside a reader with words about streams; both are refused here, before any open.
void require_regular_file(const std::string& path, const std::string& what);

}  // namespace inferlab
