#pragma once
/// @file cached_batch.h
/// @brief The per-step context of attention over the caches of a batch (what nano-vllm calls its
/// context): built once a forward pass, read by every layer.
///
/// A batch step's attention needs, for every sequence, where its cache keeps each layer's keys and
/// values (rows of its own, or blocks of a shared pool through a block table), which rows of the
/// step are its queries, at which positions, and so into which slots their new keys and values go.
/// None of that changes from one layer to the next, so it is gathered once, packed into one array
/// of words and, on the GPU, uploaded in one copy. Every layer then makes two calls for the whole
/// batch: ops::store_cached writes the step's new K and V rows straight into their slots, and
/// ops::attention_cached attends every query row over its own sequence's cache (on the GPU one
/// launch each, and the split-K merge).
///
/// The packed words are read by the CUDA kernels and by the CPU path alike, through the same
/// functions (cached_batch::View), so that the CPU tests check the index arithmetic the GPU runs.

#include <cstdint>
#include <vector>

#include "common/host_device.h"
#include "common/ops.h"
#include "common/tensor.h"

namespace inferlab {

/// One sequence of a batch step, in every layer: CachedKV's fields with each layer's storage.
struct CachedSeq {
  std::vector<Tensor> k, v;                          ///< layer l's storage, rows [rows, Nk, Dqk] and [rows, Nk, Dv]
  const std::vector<std::int32_t>* table = nullptr;  ///< null: position p is row p (CachedKV::table)
  std::int64_t block_size = 1;
  std::int64_t length = 0;              ///< positions it holds once the step's new ones are stored
  std::int64_t q_begin = 0, q_end = 0;  ///< its rows of the step's q, k, v and out
  /// Position of its first row; −1: length − (q_end − q_begin), its rows are its last positions.
  std::int64_t q_offset = -1;
};

namespace cached_batch {

/// Positions one work item of the attention kernel attends at most (a split of split-K).
constexpr std::int64_t kRange = 256;

/// The packed context, int64 words:
///   header     kHeader words, named below
///   sequences  kSeqWords words each, named below
///   rows       for each query row of the step, its sequence (−1: a row attended another way)
///   items      rows + 1 words: the first work item of each row, a running sum (a row of
///              sequence b has ceil(length_b / per) items: ranges of `per` positions)
///   tables     every sequence's block table, one after another
///   k, v       for each layer, for each sequence, the address of its storage (layer after layer)
enum Header : int { kSeqs, kRows, kLayers, kPer, kRowsAt, kItemsAt, kTablesAt, kKAt, kVAt, kHeader };
enum Seq : int { kQBegin, kQEnd, kQOffset, kLength, kTableAt, kBlockSize, kSeqWords };

/// Reads the packed words: on the host, and in the kernels.
struct View {
  const std::int64_t* w;

  IL_HD std::int64_t seqs() const { return w[kSeqs]; }
  IL_HD std::int64_t rows() const { return w[kRows]; }
  IL_HD std::int64_t per() const { return w[kPer]; }
  IL_HD std::int64_t field(std::int64_t b, int f) const { return w[kHeader + b * kSeqWords + f]; }
  /// The sequence whose query row i is; −1 for a row no sequence here names.
  IL_HD std::int64_t sequence_of(std::int64_t i) const { return w[w[kRowsAt] + i]; }
  /// Row i's first work item; first_item(rows()) is the number of items.
  IL_HD std::int64_t first_item(std::int64_t i) const { return w[w[kItemsAt] + i]; }
  /// The query row of a work item: the last row whose first item is at or before it (rows with no
  /// items share their first item with the next row, so they are never the answer).
  IL_HD std::int64_t row_of_item(std::int64_t item) const {
    std::int64_t lo = 0, hi = rows();
    while (hi - lo > 1) {
      const std::int64_t mid = (lo + hi) / 2;
      if (first_item(mid) <= item) lo = mid;
      else hi = mid;
    }
    return lo;
  }
  /// The position of query row i of sequence b among its positions.
  IL_HD std::int64_t position(std::int64_t b, std::int64_t i) const { return field(b, kQOffset) + i - field(b, kQBegin); }
  /// The row of its storage where sequence b keeps position p: p itself, or through its block
  /// table, table[p / B]·B + p % B.
  IL_HD std::int64_t row(std::int64_t b, std::int64_t p) const {
    const std::int64_t at = field(b, kTableAt), B = field(b, kBlockSize);
    return at < 0 ? p : w[w[kTablesAt] + at + p / B] * B + p % B;
  }
  /// Layer l's storage of sequence b.
  IL_HD float* k(std::int64_t l, std::int64_t b) const { return reinterpret_cast<float*>(w[w[kKAt] + l * seqs() + b]); }
  IL_HD float* v(std::int64_t l, std::int64_t b) const { return reinterpret_cast<float*>(w[w[kVAt] + l * seqs() + b]); }
};

/// The keys a query row sees, positions lo .. hi.
struct Keys {
  std::int64_t lo, hi;
};
/// Row i of sequence b: causal, positions up to its own (the last `window` of them with a window);
/// else all of the sequence's.
IL_HD inline Keys keys(const View& c, std::int64_t b, std::int64_t i, bool causal, std::int64_t window) {
  const std::int64_t hi = causal ? c.position(b, i) : c.field(b, kLength) - 1;
  const std::int64_t lo = window > 0 && hi - window + 1 > 0 ? hi - window + 1 : 0;
  return {lo, hi};
}

/// The positions work item `item` attends, start .. start + n − 1 (n = 0: past its row's keys):
/// the item's range of `per` positions counted from the first key its row sees.
struct Range {
  std::int64_t row, sequence, start, n;
};
IL_HD inline Range range(const View& c, std::int64_t item, bool causal, std::int64_t window) {
  const std::int64_t i = c.row_of_item(item), b = c.sequence_of(i);
  const Keys k = keys(c, b, i, causal, window);
  const std::int64_t start = k.lo + (item - c.first_item(i)) * c.per(), end = start + c.per();
  const std::int64_t n = (end < k.hi + 1 ? end : k.hi + 1) - start;
  return {i, b, start, n > 0 ? n : 0};
}

}  // namespace cached_batch

/// The context itself: the sequences, their packed words, and (for CUDA storage) the words' copy on
/// the device, uploaded once by the constructor.
class CachedBatch {
 public:
  /// `rows`: the step's query rows (those of these sequences and of any attended some other way);
  /// `per`: positions a work item attends at most (at most cached_batch::kRange). Checks that
  /// every sequence's storage, table and rows fit, naming the sequence.
  CachedBatch(std::vector<CachedSeq> seqs, std::int64_t rows, std::int64_t per = cached_batch::kRange);

  const std::vector<CachedSeq>& seqs() const { return seqs_; }
  std::int64_t rows() const { return rows_; }
  std::int64_t layers() const { return seqs_.empty() ? 0 : static_cast<std::int64_t>(seqs_[0].k.size()); }
  Device device() const { return device_; }
  /// Work items of the attention kernel (ranges of `per` positions of each query row).
  std::int64_t items() const;
  /// Whether every storage row of every layer, and every new row of k and v, can be moved 16 bytes
  /// at a time (the widths are multiples of 4 floats and the storage starts 16-byte aligned).
  bool aligned16() const { return aligned16_; }
  /// Layer l as ops::attention_cached reads it: one CachedKV a sequence.
  std::vector<CachedKV> layer(std::int64_t l) const;
  /// The packed words on the host (cached_batch::View reads them), and their copy on the device
  /// (undefined for storage on the CPU).
  const std::vector<std::int64_t>& words() const { return words_; }
  const Tensor& device_words() const { return device_words_; }

 private:
  std::vector<CachedSeq> seqs_;
  std::int64_t rows_;
  Device device_ = Device::CPU;
  bool aligned16_ = true;
  std::vector<std::int64_t> words_;
  Tensor device_words_;
};

}  // namespace inferlab
