// Chapter 02 is chapter 01 plus a cache: the README shows the diff of the two forward passes and
// states its size. This test recomputes that diff from the sources, so the README cannot drift
// from the code, and the diff cannot grow past the size the README promises.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

namespace {

const std::string kSource = INFERLAB_SOURCE_DIR;

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot read " << path;
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// The forward pass and its attention block: from "// The forward pass:" to the second function's end.
std::vector<std::string> forward_pass(const std::string& path) {
  std::vector<std::string> out;
  int ends = 0;
  for (const std::string& l : lines_of(path)) {
    if (out.empty() && l.rfind("// The forward pass:", 0) != 0) continue;
    out.push_back(l);
    if (l == "}" && ++ends == 2) break;
  }
  EXPECT_EQ(ends, 2) << path << ": the forward pass and attention block were not found";
  return out;
}

// A line diff by longest common subsequence: "-" lines of a, "+" lines of b, in order.
std::vector<std::string> diff(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  const std::size_t n = a.size(), m = b.size();
  std::vector<std::vector<int>> lcs(n + 1, std::vector<int>(m + 1, 0));
  for (std::size_t i = n; i-- > 0;)
    for (std::size_t j = m; j-- > 0;)
      lcs[i][j] = a[i] == b[j] ? lcs[i + 1][j + 1] + 1 : std::max(lcs[i + 1][j], lcs[i][j + 1]);
  std::vector<std::string> out;
  std::size_t i = 0, j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && a[i] == b[j]) ++i, ++j;
    else if (j < m && (i == n || lcs[i][j + 1] >= lcs[i + 1][j])) out.push_back("+" + b[j++]);
    else out.push_back("-" + a[i++]);
  }
  return out;
}

}  // namespace

TEST(Lesson, ChapterTwoIsChapterOnePlusTheCacheLines) {
  const auto changes = diff(forward_pass(kSource + "/chapters/01_naive_decode/llama.cpp"),
                            forward_pass(kSource + "/chapters/02_kv_cache/kv_cache.cpp"));
  std::size_t added = 0;
  for (const auto& c : changes) added += c[0] == '+';

  // The README's ```diff block, its changed lines only, and the size it states.
  const auto readme = lines_of(kSource + "/chapters/02_kv_cache/README.md");
  std::vector<std::string> shown;
  std::size_t stated = 0;
  bool in_block = false;
  const std::regex size(R"(\*\*(\d+) lines\*\* of chapter 02's forward pass)");
  for (const std::string& l : readme) {
    std::smatch mt;
    if (std::regex_search(l, mt, size)) stated = std::stoul(mt[1]);
    if (l == "```diff") in_block = true;
    else if (in_block && l == "```") in_block = false;
    else if (in_block && (l[0] == '+' || l[0] == '-') && l.rfind("+++", 0) != 0 && l.rfind("---", 0) != 0)
      shown.push_back(l);
  }
  ASSERT_GT(stated, 0u) << "the README does not state the diff's size (\"**N lines** of chapter 02's forward pass\")";
  EXPECT_LE(added, stated) << "chapter 02's forward pass now differs from chapter 01's in more lines than its README says";
  // The same changed lines (a diff tool may order a hunk's lines differently from this one).
  auto sorted = [](std::vector<std::string> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(sorted(shown), sorted(changes)) << "the README's diff is not the diff of the sources; regenerate it with "
                                               "the command the README gives";
}
