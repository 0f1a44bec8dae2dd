// Chapter 05 is chapter 02 with one piece replaced: its attention block, whose diff against chapter
// 02's the README shows and sizes. This test recomputes that diff from the sources.
#include "lesson_diff.h"

namespace {

const std::string kSource = INFERLAB_SOURCE_DIR;

std::vector<std::string> attention_block(const std::string& path) {
  return inferlab::test::code_from(path, "Tensor attention_block(", 1);
}

}  // namespace

TEST(Lesson, ChapterFiveIsChapterTwosAttentionBlockPlusTheSharingLines) {
  inferlab::test::expect_readme_shows(kSource + "/chapters/05_cla/README.md", "of chapter 05's attention block",
                                      inferlab::test::line_diff(attention_block(kSource + "/common/models/kv_cache.cpp"),
                                                                attention_block(kSource + "/common/models/cla.cpp")));
}
