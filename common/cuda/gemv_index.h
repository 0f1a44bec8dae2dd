#pragma once
/// @file gemv_index.h
/// @brief The index arithmetic of the GEMV family's versions 2 and 3 (common/cuda/gemv.cuh): which
/// groups of output rows a block computes, which rows of a group a warp computes, which 16-byte
/// loads of a row a lane issues at each step, which of up to three stacked matrices a row belongs to. Plain C++ marked IL_HD, so that a CPU test
/// walks the kernels' own loops and checks that every row and every weight is read exactly once.

#include "common/host_device.h"

namespace inferlab::cuda::gemv_index {

/// Warps in a block of versions 2 and 3 (128 threads: many blocks fit on an SM beside each other).
constexpr int kWarps = 4;
/// 16-byte weight loads each lane has in flight at once, over all the rows it reads together:
/// 256 bytes a lane, 32 KiB a block, so that even a short matrix (2048 rows: 8 warps an SM) keeps
/// about 64 KiB a SM in flight, more than the memory's bandwidth times its latency.
constexpr int kLoads = 16;

/// Loads per row a lane issues in one step when it reads `rows` weight rows together (kLoads
/// shared among them, at least one each).
IL_HD constexpr int unroll(int rows) { return kLoads / rows > 0 ? kLoads / rows : 1; }

/// A group is `rows` consecutive output rows for each of a block's kWarps warps; the first of
/// the rows that warp `warp` computes in group `group`.
IL_HD constexpr long long first_row(long long group, int warp, int rows) {
  return (group * kWarps + warp) * static_cast<long long>(rows);
}

/// Groups of kWarps · `rows` rows over `total` output rows.
IL_HD constexpr long long groups(long long total, int rows) {
  return (total + static_cast<long long>(kWarps) * rows - 1) / (static_cast<long long>(kWarps) * rows);
}

/// Blocks launched for `groups` groups: one a group where they all fit on the GPU at once
/// (`resident` blocks a SM), else as few as give every block the same number of groups, at most
/// one fewer (groups block, block + grid, ...): each block stages x once, and none is left
/// working alone at the end.
IL_HD constexpr long long grid(long long groups, int sms, int resident) {
  const long long slots = static_cast<long long>(sms) * resident;
  if (groups <= slots) return groups;
  const long long per = (groups + slots - 1) / slots;
  return (groups + per - 1) / per;
}

/// Rows a warp computes: 4 where that still leaves two groups for every SM, else 2. More rows a
/// warp share each value of x read from shared memory among more weights; fewer keep every SM
/// busy on a short matrix (2048 rows: 256 groups of 8 rows for 132 SMs).
IL_HD constexpr int rows_per_warp(long long total, int sms) { return groups(total, 4) >= 2LL * sms ? 4 : 2; }

/// The output row a warp reads in place of `row` past the end (the last one: its loads are
/// wasted but valid, and every warp reaches the block's synchronisation); its result is not
/// written.
IL_HD constexpr long long clamp_row(long long row, long long total) { return row < total ? row : total - 1; }

/// The 16-byte load (a row's index in units of 16 bytes) that lane `lane` issues as its load `u`
/// of step `step`, with `unroll` loads a step: a warp's 32 lanes read 512 consecutive bytes.
IL_HD constexpr long long chunk(long long step, int u, int lane, int unroll) { return (step * unroll + u) * 32 + lane; }

/// Steps over a row of `n` 16-byte loads (the last one partial: loads at or past n are skipped).
IL_HD constexpr long long steps(long long n, int unroll) { return (n + 32LL * unroll - 1) / (32LL * unroll); }

/// Which of up to three stacked matrices (`rows0`, `rows1` rows, then the rest; `count` of them)
/// holds stacked row `row`, and its row there (`local`).
IL_HD inline int segment_of(long long row, int rows0, int rows1, int count, long long& local) {
  local = row;
  if (count > 1 && local >= rows0) {
    local -= rows0;
    if (count > 2 && local >= rows1) {
      local -= rows1;
      return 2;
    }
    return 1;
  }
  return 0;
}

}  // namespace inferlab::cuda::gemv_index
