#pragma once
// A chapter reads as a diff on the chapter before it: its README shows the diff of a piece of the
// two chapters' code and states its size. These helpers recompute that diff from the sources, so
// a test can fail when the README drifts from the code or the diff grows past the promised size.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

namespace inferlab::test {

inline std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot read " << path;
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

/// The lines of `path` from the first one starting with `first` through the end ("}" alone on
/// a line) of the `functions`-th function after it.
inline std::vector<std::string> code_from(const std::string& path, const std::string& first, int functions) {
  std::vector<std::string> out;
  int ends = 0;
  for (const std::string& l : lines_of(path)) {
    if (out.empty() && l.rfind(first, 0) != 0) continue;
    out.push_back(l);
    if (l == "}" && ++ends == functions) break;
  }
  EXPECT_EQ(ends, functions) << path << ": the code from '" << first << "' was not found";
  return out;
}

/// A line diff by longest common subsequence: "-" lines of a, "+" lines of b, in order.
inline std::vector<std::string> line_diff(const std::vector<std::string>& a, const std::vector<std::string>& b) {
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

/// Expects the README's ```diff block (its changed lines) to be `changes`, and the size the
/// README states (the number in "**N lines** <size_phrase>") to be at least the added lines.
inline void expect_readme_shows(const std::string& readme, const std::string& size_phrase,
                                const std::vector<std::string>& changes) {
  std::size_t added = 0;
  for (const auto& c : changes) added += c[0] == '+';
  std::vector<std::string> shown;
  std::size_t stated = 0;
  bool in_block = false;
  const std::regex size(R"(\*\*(\d+) lines\*\* )" + size_phrase);
  for (const std::string& l : lines_of(readme)) {
    std::smatch mt;
    if (std::regex_search(l, mt, size)) stated = std::stoul(mt[1]);
    if (l == "```diff") in_block = true;
    else if (in_block && l == "```") in_block = false;
    else if (in_block && (l[0] == '+' || l[0] == '-') && l.rfind("+++", 0) != 0 && l.rfind("---", 0) != 0)
      shown.push_back(l);
  }
  ASSERT_GT(stated, 0u) << readme << " does not state the diff's size (\"**N lines** " << size_phrase << "\")";
  EXPECT_LE(added, stated) << "the code now differs in more lines than " << readme << " says";
  // The same changed lines (a diff tool may order a hunk's lines differently from this one).
  auto sorted = [](std::vector<std::string> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(sorted(shown), sorted(changes)) << readme
                                            << "'s diff is not the diff of the sources; regenerate it "
                                               "with the command the README gives";
}

}  // namespace inferlab::test
