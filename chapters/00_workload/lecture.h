#pragma once
/// @file lecture.h
/// @brief Every number in the lecture, recomputed: docs/lecture-numbers.md is generated here.

#include <string>
#include <vector>

namespace inferlab::ch00 {

/// One numeric claim of the lecture and what this chapter's code computes for it.
struct Claim {
  std::string section;   ///< the lecture's section
  std::string claim;     ///< what is claimed, in words
  std::string lecture;   ///< the lecture's value, as it prints it
  std::string computed;  ///< our value, formatted; "" when it cannot be computed here
  enum Verdict { Agree, Disagree, External } verdict = Agree;
  std::string why;   ///< for a disagreement: why; for an external figure: its source
  double value = 0;  ///< the computed number (for tests), NaN when there is none
};

/// All claims, in lecture order.
std::vector<Claim> lecture_claims();
/// The page docs/lecture-numbers.md, generated from lecture_claims().
std::string lecture_markdown();

/// Expected tokens produced per round of speculative sampling with γ drafted tokens and
/// acceptance rate α (Leviathan et al. 2023, eq. 1): (1 − α^(γ+1)) / (1 − α).
double speculative_expected_tokens(double alpha, int gamma);
/// Largest finite value of an 8-bit float with 4 exponent bits (bias 7) and 3 mantissa bits:
/// 448 in the OCP "E4M3FN" encoding that Hopper implements (only S.1111.111 is NaN), 240 if the
/// top exponent is reserved for infinities and NaNs as in IEEE 754.
double e4m3_max(bool ieee_like);

}  // namespace inferlab::ch00
