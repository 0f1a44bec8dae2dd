// Chapter 02 is chapter 01 plus a cache: the README shows the diff of the two forward passes and
// states its size. This test recomputes that diff from the sources, so the README cannot drift
// from the code, and the diff cannot grow past the size the README promises.
#include "lesson_diff.h"

namespace {

const std::string kSource = INFERLAB_SOURCE_DIR;

// The forward pass and its attention block: from "// The forward pass:" to the second function's end.
std::vector<std::string> forward_pass(const std::string& path) {
  return inferlab::test::code_from(path, "// The forward pass:", 2);
}

}  // namespace

TEST(Lesson, ChapterTwoIsChapterOnePlusTheCacheLines) {
  inferlab::test::expect_readme_shows(
      kSource + "/chapters/02_kv_cache/README.md", "of chapter 02's forward pass",
      inferlab::test::line_diff(forward_pass(kSource + "/chapters/01_naive_decode/llama.cpp"),
                                forward_pass(kSource + "/common/models/kv_cache.cpp")));
}
