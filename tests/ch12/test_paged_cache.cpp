// Chapter 12: the block pool, the paged cache and chapter 11's engine on it. Conservation of
// blocks under random operations, copy-on-write, prefix sharing, and the engine's outputs the same
// on a paged and on a contiguous cache.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "bundled_model.h"
#include "chapters/11_continuous_batching/trace.h"
#include "chapters/12_paged_attention/paged_attention.h"
#include "chapters/12_paged_attention/paged_cache.h"
#include "common/eval.h"
#include "engine_runs.h"
#include "golden_util.h"

using namespace inferlab;
using namespace inferlab::ch12;

namespace {

const std::string kData = INFERLAB_DATA_DIR;

const models::Llama& tiny_mha() { return test::bundled_llama("tiny-mha"); }

TransformerConfig one_layer() {
  TransformerConfig c;
  c.architecture = "LlamaForCausalLM";
  c.hidden_size = 32, c.intermediate_size = 64, c.num_layers = 1, c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = 8;
  c.vocab_size = 64, c.max_position_embeddings = 256, c.rms_norm_eps = 1e-5, c.rope_theta = 1e4;
  return c;
}

// Every block's reference count is the number of live caches whose table lists it, and the free
// blocks are exactly those nobody lists.
void expect_conserved(const BlockPool& pool, const std::vector<std::unique_ptr<PagedKVCache>>& caches) {
  std::map<std::int32_t, int> listed;
  for (const auto& c : caches)
    for (std::int32_t b : c->block_table()) listed[b]++;
  std::int64_t unreferenced = 0;
  for (std::int32_t b = 0; b < pool.total(); ++b) {
    ASSERT_EQ(pool.refs(b), listed.count(b) ? listed[b] : 0) << "block " << b;
    unreferenced += pool.refs(b) == 0;
  }
  ASSERT_EQ(pool.free(), unreferenced);
  ASSERT_EQ(pool.free() + pool.used(), pool.total());
}

}  // namespace

// 10,000 random operations: open a sequence, append to one, fork one, truncate one, free one.
TEST(BlockPool, ConservationUnderTenThousandRandomOperations) {
  auto rng = test::rng_for_test();
  const auto c = one_layer();
  BlockPool pool(c, 64, 4);
  std::vector<std::unique_ptr<PagedKVCache>> caches;
  std::int64_t refused = 0, forks = 0;
  for (int i = 0; i < 10000; ++i) {
    const int op = static_cast<int>(rng() % 100);
    const std::int64_t free_before = pool.free();
    if (op < 15 || caches.empty()) {  // open, with a first run of positions
      auto s = std::make_unique<PagedKVCache>(pool);
      const std::int64_t n = 1 + static_cast<std::int64_t>(rng() % 12);
      if (s->reserve(n)) {
        s->commit(n), caches.push_back(std::move(s));
      } else {
        ++refused;
        ASSERT_EQ(pool.free(), free_before) << "a refused reserve took blocks";
      }
    } else {
      const std::size_t k = static_cast<std::size_t>(rng() % caches.size());
      PagedKVCache& s = *caches[k];
      if (op < 65) {  // append
        const std::int64_t n = 1 + static_cast<std::int64_t>(rng() % 6);
        const auto table = s.block_table();
        if (s.reserve(n)) {
          s.commit(n);
        } else {
          ++refused;
          ASSERT_EQ(pool.free(), free_before);
          ASSERT_EQ(s.block_table(), table) << "a refused reserve changed the table";
        }
      } else if (op < 72) {  // fork, sometimes with room reserved ahead (the fork must not share it)
        std::int64_t ahead = 0;
        if (op % 2 && s.reserve(1 + static_cast<std::int64_t>(rng() % 5))) ahead = 1;
        const std::int64_t free_mid = pool.free();
        caches.push_back(s.fork());
        ++forks;
        ASSERT_EQ(pool.free(), free_mid) << "a fork took blocks";
        for (std::size_t b = 0; b < caches.back()->block_table().size(); ++b)
          ASSERT_EQ(caches.back()->block_table()[b], s.block_table()[b]);
        ASSERT_EQ(static_cast<std::int64_t>(caches.back()->block_table().size()), (s.length() + 3) / 4);
        if (ahead) s.truncate(s.length());  // give the room back, so the table needs no more than it holds
      } else if (op < 78) {                 // publish the full blocks, then adopt them from a new cache
        // A position's "token" is its slot: blocks that are shared hold the same tokens, and
        // different blocks never collide.
        std::vector<std::int32_t> tokens(static_cast<std::size_t>(s.length()));
        for (std::size_t t = 0; t < tokens.size(); ++t)
          tokens[t] = s.block_table()[t / 4] * 4 + static_cast<std::int32_t>(t % 4);
        s.publish(tokens);
        auto twin = std::make_unique<PagedKVCache>(pool);
        ASSERT_EQ(twin->adopt_prefix(tokens, s.length()), s.length() / 4 * 4) << "a published prefix is not found";
        caches.push_back(std::move(twin));
      } else if (op < 85) {  // truncate
        s.truncate(static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(s.length() + 1)));
      } else {  // free: blocks come back exactly when their last holder lets go
        std::int64_t last_holder = 0;
        for (std::int32_t b : s.block_table()) last_holder += pool.refs(b) == 1;
        caches.erase(caches.begin() + static_cast<long>(k));
        ASSERT_EQ(pool.free(), free_before + last_holder);
      }
    }
    expect_conserved(pool, caches);
    for (const auto& s : caches)
      ASSERT_EQ(static_cast<std::int64_t>(s->block_table().size()), (s->length() + 3) / 4)
          << "a cache holds a block it does not need";
    ASSERT_LE(pool.free(), pool.total());
  }
  EXPECT_GT(refused, 0) << "the pool never ran out";
  EXPECT_GT(forks, 100);
  caches.clear();
  EXPECT_EQ(pool.free(), pool.total());
}

// Copy-on-write: a fork shares every block; the first write of either side into the shared,
// partly filled last block copies that block alone, and the other side's rows stay as they were.
// The copy-on-write rule alone, on a pool's blocks and a table made by hand (no reserve): only a
// partly filled block that another holder shares or the prefix cache holds is copied.
TEST(PagedCache, TheCopyOnWriteRule) {
  BlockPool pool(one_layer(), 4, 4);
  const std::vector<std::int32_t> table = {pool.allocate(), pool.allocate()};  // positions 0 .. 7
  EXPECT_FALSE(must_copy_before_writing(pool, table, 6, 1)) << "its own block";
  pool.retain(table[1]);  // a fork shares it
  EXPECT_TRUE(must_copy_before_writing(pool, table, 6, 1)) << "a shared, partly filled block";
  EXPECT_TRUE(must_copy_before_writing(pool, table, 5, 3));
  EXPECT_FALSE(must_copy_before_writing(pool, table, 6, 0)) << "nothing written";
  EXPECT_FALSE(must_copy_before_writing(pool, table, 8, 1)) << "full: the next position starts a new block";
  EXPECT_FALSE(must_copy_before_writing(pool, table, 4, 2)) << "at a block boundary nothing is copied";
  EXPECT_FALSE(must_copy_before_writing(pool, table, 2, 1)) << "block 0 is not shared";
  pool.release(table[1]);
  const std::vector<std::int32_t> tokens = {1, 2, 3, 4};
  pool.publish(table[0], 0, -1, tokens.data());  // the prefix cache holds block 0
  EXPECT_TRUE(must_copy_before_writing(pool, table, 2, 1)) << "a block in the prefix cache is never written again";
  EXPECT_FALSE(must_copy_before_writing(pool, table, 6, 1));
}

TEST(PagedCache, CopyOnWriteCopiesOnlyThePartlyFilledLastBlock) {
  auto rng = test::rng_for_test();
  const auto c = one_layer();
  BlockPool pool(c, 16, 4);
  PagedKVCache parent(pool);
  auto store = [&](PagedKVCache& s, std::int64_t n) {  // n positions of random K and V through attend
    ASSERT_TRUE(s.reserve(n));
    const Tensor q = test::uniform(rng, {n, 4, 8}), k = test::uniform(rng, {n, 2, 8}), v = test::uniform(rng, {n, 2, 8});
    Tensor out = Tensor::empty(q.shape(), DType::F32);
    s.attend(0, q, k, v, out);
    s.commit(n);
  };
  store(parent, 10);  // blocks of 4, 4 and 2 positions
  const auto before_k = pool.k(0).to_double_vector();
  auto child = parent.fork();
  EXPECT_EQ(child->block_table(), parent.block_table());
  store(*child, 3);
  EXPECT_EQ(pool.copies, 1);
  EXPECT_EQ(child->block_table()[0], parent.block_table()[0]);
  EXPECT_EQ(child->block_table()[1], parent.block_table()[1]);
  EXPECT_NE(child->block_table()[2], parent.block_table()[2]);
  const auto after_k = pool.k(0).to_double_vector();
  const std::int64_t row = 4 * 2 * 8;  // floats in one block
  for (std::int32_t b : parent.block_table())
    for (std::int64_t i = 0; i < row; ++i)
      ASSERT_EQ(after_k[static_cast<std::size_t>(b * row + i)], before_k[static_cast<std::size_t>(b * row + i)])
          << "the parent's block " << b << " changed";
  // The copy holds the parent's two positions of that block, then the child's own.
  const std::int32_t mine = child->block_table()[2], theirs = parent.block_table()[2];
  for (std::int64_t i = 0; i < 2 * 2 * 8; ++i)
    ASSERT_EQ(after_k[static_cast<std::size_t>(mine * row + i)], before_k[static_cast<std::size_t>(theirs * row + i)]);
  store(parent, 1);  // the parent's last block is its own again: written in place
  EXPECT_EQ(pool.copies, 1);
  // A fork at a block boundary copies nothing: the next write starts a new block.
  PagedKVCache even(pool);
  store(even, 8);
  auto twin = even.fork();
  store(*twin, 2);
  EXPECT_EQ(pool.copies, 1);
}

// Through chapter 02's forward pass, a paged cache gives what a contiguous one gives, for every
// block size, with prefill chunks and decode steps.
TEST(PagedCache, ForwardEqualsTheContiguousCache) {
  const models::Llama& m = tiny_mha();
  const auto text = eval::validation_tokens(kData, 300);
  for (const std::int64_t B : {1, 16, 32}) {
    BlockPool pool(m.config, 200 / B + 8, B);
    PagedKVCache paged(pool);
    models::ContiguousKVCache contiguous(m.config, 200);
    std::size_t at = 0;
    for (const std::size_t n : {37u, 1u, 1u, 20u, 1u, 5u}) {
      const std::vector<std::int32_t> feed(text.begin() + static_cast<long>(at), text.begin() + static_cast<long>(at + n));
      at += n;
      ASSERT_TRUE(paged.reserve(static_cast<std::int64_t>(n)));
      const auto got = models::forward_cached(m, paged, feed).to_float_vector();
      const auto want = models::forward_cached(m, contiguous, feed).to_double_vector();
      const double bound = test::two_path_bound(m.config, want);
      for (std::size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], bound) << "B = " << B << ", at " << at;
    }
  }
}

namespace {

std::vector<ch11::Request> mixed_requests() { return test::mixed_requests(kData); }

std::vector<test::Served> serve(ch11::KVPool& pool, const std::vector<ch11::Request>& requests,
                                std::int64_t* preemptions = nullptr, models::AttendPath path = models::AttendPath::Batched,
                                const models::Llama& m = tiny_mha()) {
  return test::serve(m, pool, requests, path, preemptions);
}

}  // namespace

// Chapter 11's engine, unchanged but for the pool: paged (block sizes 1, 16, 32; a tight budget
// that forces preemptions) gives every request the tokens the contiguous cache gives, and logits
// within the two-path bound.
TEST(PagedCache, TheEnginesOutputsAreTheSameOnEitherCache) {
  const models::Llama& m = tiny_mha();
  const auto requests = mixed_requests();
  ch11::ContiguousPool contiguous(m.config, m.config.kv_cache_bytes(4096, 4), ch11::Allocation::MaxLength);
  const auto want = serve(contiguous, requests);
  for (const std::int64_t B : {1, 16, 32}) {
    PagedPool paged(m.config, m.config.kv_cache_bytes(B == 1 ? 120 : 160, 4), B);
    std::int64_t preemptions = 0;
    const auto got = serve(paged, requests, &preemptions);
    EXPECT_GT(preemptions, 0) << "B = " << B << ": the budget never ran out";
    EXPECT_EQ(paged.used_bytes(), 0);
    for (std::size_t i = 0; i < requests.size(); ++i) {
      ASSERT_EQ(got[i].tokens, want[i].tokens) << "B = " << B << ", request " << i;
      for (std::size_t t = 0; t < want[i].logits.size(); ++t) {
        const std::vector<double> w(want[i].logits[t].begin(), want[i].logits[t].end());
        const double bound = test::two_path_bound(m.config, w);
        for (std::size_t v = 0; v < w.size(); ++v) ASSERT_NEAR(got[i].logits[t][v], w[v], bound);
      }
    }
  }
}

// The batched step (one attention call a layer over every sequence's cache, where it is) against
// the simple one (each cache's own attend()), on the engine's ragged steps (prefill chunks beside
// decode rows) with MHA, GQA and MQA: on contiguous caches the same bits; on paged caches the
// batched step reads through the block tables and gives the contiguous bits again. (Under a tight
// budget, preempted sequences recompute their rows in a prefill, which rounds differently: the
// test above holds the batched paged step to the two-path bound there, and this one the simple
// paged step, chapter 12's split-KV op.)
TEST(PagedCache, TheBatchedStepEqualsTheSequenceBySequenceStep) {
  using models::AttendPath;
  for (const char* name : {"tiny-mha", "tiny-gqa", "tiny-mqa"}) {
    const models::Llama& m = test::bundled_llama(name);
    const auto requests = mixed_requests();
    ch11::ContiguousPool contiguous(m.config, m.config.kv_cache_bytes(4096, 4), ch11::Allocation::MaxLength);
    const auto alone = serve(contiguous, requests, nullptr, AttendPath::PerSequence, m);
    const auto batched = serve(contiguous, requests, nullptr, AttendPath::Batched, m);
    PagedPool ample(m.config, m.config.kv_cache_bytes(4096, 4), 16);
    const auto paged_batched = serve(ample, requests, nullptr, AttendPath::Batched, m);
    for (std::size_t i = 0; i < requests.size(); ++i) {
      ASSERT_EQ(batched[i].tokens, alone[i].tokens) << name << ", request " << i;
      EXPECT_EQ(batched[i].logits, alone[i].logits) << name << ", request " << i << ": contiguous, batched vs alone";
      EXPECT_EQ(paged_batched[i].logits, alone[i].logits) << name << ", request " << i << ": paged, batched";
    }
    if (std::string(name) != "tiny-mha") continue;
    PagedPool tight(m.config, m.config.kv_cache_bytes(160, 4), 16);
    std::int64_t preemptions = 0;
    const auto tight_alone = serve(tight, requests, &preemptions, AttendPath::PerSequence, m);
    EXPECT_GT(preemptions, 0) << "the tight budget never ran out";
    EXPECT_EQ(tight.used_bytes(), 0);
    for (std::size_t i = 0; i < requests.size(); ++i) {
      ASSERT_EQ(tight_alone[i].tokens, alone[i].tokens) << "request " << i << ": tight paged, alone";
      for (std::size_t t = 0; t < alone[i].logits.size(); ++t) {
        const std::vector<double> w(alone[i].logits[t].begin(), alone[i].logits[t].end());
        const double bound = test::two_path_bound(m.config, w);
        for (std::size_t v = 0; v < w.size(); ++v) ASSERT_NEAR(tight_alone[i].logits[t][v], w[v], bound);
      }
    }
  }
}

namespace {

// A contiguous cache of another type: the batched ops do not read it (ContiguousKVCache::locate
// refuses subclasses, which may attend their own way), so it attends on its own beside the batch.
class OwnWayCache : public models::ContiguousKVCache {
 public:
  using models::ContiguousKVCache::ContiguousKVCache;
};

// One batch's caches: two paged ones in a pool whose free list earlier allocations shuffled (their
// block tables are not 0, 1, 2, ...), a contiguous one and one that attends on its own.
struct FourCaches {
  BlockPool pool;
  PagedKVCache a, b;
  models::ContiguousKVCache rows;
  OwnWayCache own;
  explicit FourCaches(const models::Llama& m)
      : pool(m.config, 40, 4), a(pool), b(pool), rows(m.config, 48), own(m.config, 48) {
    std::vector<std::int32_t> taken;
    for (int i = 0; i < 6; ++i) taken.push_back(pool.allocate());
    for (const int i : {4, 0, 2}) pool.release(taken[static_cast<std::size_t>(i)]);
  }
  // A step of n[i] new tokens for cache i (the paged ones reserved first), from its own stretch of text.
  std::vector<models::SequenceStep> step(const std::vector<std::int32_t>& text, const std::vector<std::int64_t>& n) {
    EXPECT_TRUE(a.reserve(n[0]) && b.reserve(n[1]));
    const std::vector<models::KVCache*> caches = {&a, &b, &rows, &own};
    std::vector<models::SequenceStep> out;
    for (std::size_t i = 0; i < caches.size(); ++i) {
      const auto from = text.begin() + static_cast<long>(40 * i + static_cast<std::size_t>(caches[i]->length()));
      out.push_back({std::vector<std::int32_t>(from, from + n[i]), caches[i], true});
    }
    return out;
  }
};

}  // namespace

// The batched step's context (Batch::cached, built once a step and, on the GPU, uploaded once)
// holds what each cache's own attend() would use: every query row's sequence and position, the
// storage row its new keys and values go to (through the block table for a paged cache, row p for
// a contiguous one), each layer's storage; its work items (the GPU's blocks) cover exactly the
// positions each row attends, causal, with a window and bidirectional, in ranges of `per`; and the
// store through it writes what each cache's own write would. The packed words are read with the
// functions the CUDA kernels run.
TEST(PagedCache, TheStepContextHoldsWhatEachCacheUses) {
  const models::Llama& m = test::bundled_llama("tiny-gqa");
  const auto text = eval::validation_tokens(kData, 400);
  FourCaches w(m);
  auto prompt = w.step(text, {9, 6, 7, 3});
  models::forward(m, prompt);
  const std::vector<models::SequenceStep> seqs = w.step(text, {1, 11, 5, 2});  // a decode row and three chunks
  const models::Batch batch(m, seqs);
  ASSERT_TRUE(batch.cached.has_value());
  EXPECT_EQ(batch.in_cached, (std::vector<bool>{true, true, true, false}));
  const CachedBatch& c = *batch.cached;
  ASSERT_EQ(c.seqs().size(), 3u);
  ASSERT_EQ(c.layers(), m.config.num_layers);
  EXPECT_EQ(c.rows(), 1 + 11 + 5 + 2);
  EXPECT_NE(w.a.block_table(), (std::vector<std::int32_t>{0, 1, 2}));
  const cached_batch::View v{c.words().data()};
  const std::int32_t* pos = batch.pos.data<std::int32_t>();
  const std::vector<const std::vector<std::int32_t>*> tables = {&w.a.block_table(), &w.b.block_table(), nullptr};
  for (std::int64_t b = 0, s = 0; b < 4; ++b) {
    const std::string what = "sequence " + std::to_string(b);
    for (std::int64_t i = batch.begin[static_cast<std::size_t>(b)]; i < batch.begin[static_cast<std::size_t>(b + 1)]; ++i) {
      if (b == 3) {
        EXPECT_EQ(v.sequence_of(i), -1) << what << ": it attends on its own";
        continue;
      }
      ASSERT_EQ(v.sequence_of(i), s) << what << ", row " << i;
      ASSERT_EQ(v.position(s, i), pos[i]) << what << ", row " << i;
      const auto* table = tables[static_cast<std::size_t>(s)];
      EXPECT_EQ(v.row(s, pos[i]), table ? slot(*table, 4, pos[i]) : pos[i]) << what << ", position " << pos[i];
    }
    if (b == 3) continue;
    for (std::int64_t l = 0; l < m.config.num_layers; ++l) {
      const void* k = b < 2 ? w.pool.k(l).raw_data() : w.rows.k(l).raw_data();
      const void* vv = b < 2 ? w.pool.v(l).raw_data() : w.rows.v(l).raw_data();
      EXPECT_EQ(static_cast<const void*>(v.k(l, s)), k) << what << ", layer " << l;
      EXPECT_EQ(static_cast<const void*>(v.v(l, s)), vv) << what << ", layer " << l;
    }
    EXPECT_EQ(v.field(s, cached_batch::kLength),
              seqs[static_cast<std::size_t>(b)].cache->length() +
                  static_cast<std::int64_t>(seqs[static_cast<std::size_t>(b)].tokens.size()));
    ++s;
  }
  // The work items, as the kernel's blocks take them: ranges of 256 positions, and of 2.
  for (const CachedBatch& ranges : {c, CachedBatch(c.seqs(), c.rows(), 2)}) {
    const cached_batch::View r{ranges.words().data()};
    for (const auto& [causal, window] : std::vector<std::pair<bool, std::int64_t>>{{true, 0}, {true, 3}, {false, 0}}) {
      std::map<std::int64_t, std::vector<std::int64_t>> seen;  // row → the positions its items attend
      for (std::int64_t item = 0; item < ranges.items(); ++item) {
        const cached_batch::Range x = cached_batch::range(r, item, causal, window);
        ASSERT_LE(x.n, r.per());
        ASSERT_EQ(x.sequence, r.sequence_of(x.row));
        for (std::int64_t p = x.start; p < x.start + x.n; ++p) seen[x.row].push_back(p);
      }
      for (std::int64_t i = 0; i < batch.begin[3]; ++i) {  // every row of the three cached sequences
        const std::int64_t s = r.sequence_of(i), length = r.field(s, cached_batch::kLength);
        const std::int64_t hi = causal ? pos[i] : length - 1, lo = window ? std::max<std::int64_t>(0, hi - window + 1) : 0;
        std::vector<std::int64_t> want;
        for (std::int64_t p = lo; p <= hi; ++p) want.push_back(p);
        EXPECT_EQ(seen[i], want) << "row " << i << ", ranges of " << r.per() << (causal ? ", causal" : "") << ", window "
                                 << window;
      }
    }
  }
  // The store through the context against each cache's own write (chapter 12's write_slots, and
  // chapter 02's rows), on copies of the storage.
  auto rng = test::rng_for_test();
  const std::int64_t K = m.config.num_kv_heads, H = m.config.head_dim, last = m.config.num_layers - 1;
  const Tensor k = test::uniform(rng, {c.rows(), K, H}), vals = test::uniform(rng, {c.rows(), K, H});
  const Tensor pool_k = w.pool.k(last).clone(), pool_v = w.pool.v(last).clone();
  const Tensor rows_k = w.rows.k(last).clone(), rows_v = w.rows.v(last).clone(), own_k = w.own.k(last).clone();
  ops::store_cached(c, last, k, vals);
  for (std::size_t b = 0; b < 3; ++b) {
    const std::int64_t r0 = batch.begin[b], r1 = batch.begin[b + 1], start = seqs[b].cache->length();
    if (b < 2) {
      write_slots({pool_k, pool_v, *tables[b], 4}, start, k.slice(0, r0, r1), vals.slice(0, r0, r1));
    } else {
      rows_k.slice(0, start, start + r1 - r0).copy_from(k.slice(0, r0, r1));
      rows_v.slice(0, start, start + r1 - r0).copy_from(vals.slice(0, r0, r1));
    }
  }
  EXPECT_EQ(w.pool.k(last).to_float_vector(), pool_k.to_float_vector());
  EXPECT_EQ(w.pool.v(last).to_float_vector(), pool_v.to_float_vector());
  EXPECT_EQ(w.rows.k(last).to_float_vector(), rows_k.to_float_vector());
  EXPECT_EQ(w.rows.v(last).to_float_vector(), rows_v.to_float_vector());
  EXPECT_EQ(w.own.k(last).to_float_vector(), own_k.to_float_vector()) << "a cache outside the context was written";
}

// Prefix caching: requests that share a prompt prefix share its blocks, compute only what
// follows, and get what they get without the cache.
TEST(PagedCache, SharedPrefixesGiveSharedBlocksAndTheSameOutputs) {
  const models::Llama& m = tiny_mha();
  const auto text = eval::validation_tokens(kData, 3000);
  std::vector<ch11::Request> requests;
  for (int i = 0; i < 6; ++i) {
    ch11::Request r;
    r.id = i;
    r.prompt.assign(text.begin() + 100, text.begin() + 170);  // 70 shared tokens: 4 full blocks of 16
    r.prompt.insert(r.prompt.end(), text.begin() + 1000 + i * 50, text.begin() + 1000 + i * 50 + 5 + i);
    r.max_new_tokens = 12;
    r.arrival = i;  // one after another, so that the first has published its blocks
    requests.push_back(r);
  }
  PagedPool plain(m.config, 8 << 20, 16), cached(m.config, 8 << 20, 16, Device::CPU, true);
  const auto want = serve(plain, requests), got = serve(cached, requests);
  EXPECT_GE(cached.blocks().hits, 5 * 4) << "every later request should find the 4 shared blocks";
  EXPECT_EQ(plain.blocks().hits, 0);
  for (std::size_t i = 0; i < requests.size(); ++i) EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
  // Sharing by hand: two caches adopting the same prefix list the same blocks.
  PagedKVCache a(cached.blocks()), b(cached.blocks());
  EXPECT_EQ(a.adopt_prefix(requests[0].prompt, 75), 64);
  EXPECT_EQ(b.adopt_prefix(requests[1].prompt, 75), 64);
  EXPECT_EQ(a.block_table(), b.block_table());
  for (std::int32_t blk : a.block_table()) EXPECT_GE(cached.blocks().refs(blk), 2);
}

// A block in the prefix cache is never written again: a cache rolled back into one (speculative
// decoding's truncate) copies it before its next write, and the cached block still holds the prefix.
TEST(PagedCache, APublishedBlockIsCopiedBeforeItIsWrittenAgain) {
  auto rng = test::rng_for_test();
  const auto c = one_layer();
  BlockPool pool(c, 8, 4);
  PagedKVCache s(pool);
  ASSERT_TRUE(s.reserve(8));
  const Tensor q = test::uniform(rng, {8, 4, 8}), k = test::uniform(rng, {8, 2, 8}), v = test::uniform(rng, {8, 2, 8});
  Tensor out = Tensor::empty(q.shape(), DType::F32);
  s.attend(0, q, k, v, out);
  s.commit(8);
  const std::vector<std::int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  s.publish(tokens);
  const std::int32_t cached = s.block_table()[1];
  const auto before = pool.k(0).slice(0, cached, cached + 1).to_double_vector();
  s.truncate(6);
  ASSERT_TRUE(s.reserve(1));
  EXPECT_EQ(pool.copies, 1);
  EXPECT_NE(s.block_table()[1], cached);
  const Tensor q1 = test::uniform(rng, {1, 4, 8}), k1 = test::uniform(rng, {1, 2, 8}), v1 = test::uniform(rng, {1, 2, 8});
  Tensor out1 = Tensor::empty(q1.shape(), DType::F32);
  s.attend(0, q1, k1, v1, out1);
  EXPECT_EQ(pool.k(0).slice(0, cached, cached + 1).to_double_vector(), before);
  PagedKVCache other(pool);
  EXPECT_EQ(other.adopt_prefix(tokens, 8), 8) << "the prefix is still cached";
}

// A fork made while room is reserved ahead shares only the blocks holding positions, and the
// first write into the shared, partly filled block copies that block (not the last one reserved).
TEST(PagedCache, CopyOnWriteWithRoomReservedAhead) {
  auto rng = test::rng_for_test();
  const auto c = one_layer();
  BlockPool pool(c, 16, 4);
  PagedKVCache parent(pool);
  auto store = [&](PagedKVCache& s, std::int64_t n) {
    const Tensor q = test::uniform(rng, {n, 4, 8}), k = test::uniform(rng, {n, 2, 8}), v = test::uniform(rng, {n, 2, 8});
    Tensor out = Tensor::empty(q.shape(), DType::F32);
    s.attend(0, q, k, v, out);
    s.commit(n);
  };
  ASSERT_TRUE(parent.reserve(5));
  store(parent, 5);                // blocks [a, b]: b holds one position
  ASSERT_TRUE(parent.reserve(8));  // room for 8 more: two blocks reserved ahead
  auto child = parent.fork();
  EXPECT_EQ(child->block_table().size(), 2u) << "the fork shares the blocks holding positions only";
  const auto before = pool.k(0).to_double_vector();
  ASSERT_TRUE(child->reserve(1));
  EXPECT_EQ(pool.copies, 1);
  EXPECT_NE(child->block_table()[1], parent.block_table()[1]) << "the shared, partly filled block was not copied";
  store(*child, 1);
  const std::int64_t row = 4 * 2 * 8;
  const std::int32_t theirs = parent.block_table()[1];
  for (std::int64_t i = 0; i < row; ++i)
    ASSERT_EQ(pool.k(0).to_double_vector()[static_cast<std::size_t>(theirs * row + i)],
              before[static_cast<std::size_t>(theirs * row + i)])
        << "the parent's block changed";
  // The same with the parent writing first: it holds room reserved ahead, so its last block is
  // not the one the next token goes into; that one is shared and must be copied.
  PagedKVCache p2(pool);
  ASSERT_TRUE(p2.reserve(5));
  store(p2, 5);
  ASSERT_TRUE(p2.reserve(4));  // a third block reserved ahead
  auto c2 = p2.fork();
  const std::int32_t shared = c2->block_table()[1];
  const auto kept = pool.k(0).slice(0, shared, shared + 1).to_double_vector();
  const std::int64_t copies = pool.copies;
  ASSERT_TRUE(p2.reserve(1));
  EXPECT_EQ(pool.copies, copies + 1) << "the parent wrote into the block its fork shares";
  store(p2, 1);
  EXPECT_EQ(pool.k(0).slice(0, shared, shared + 1).to_double_vector(), kept) << "the fork's block changed";
  // Writing without reserving into a block another holder shares is an error, not a corruption.
  PagedKVCache a(pool);
  ASSERT_TRUE(a.reserve(2));
  store(a, 2);
  auto b = a.fork();
  const Tensor q = test::uniform(rng, {1, 4, 8}), k = test::uniform(rng, {1, 2, 8});
  Tensor out = Tensor::empty(q.shape(), DType::F32);
  test::expect_error([&] { b->attend(0, q, k, k, out); }, {"would be written but is shared", "reserve before writing"});
}

// Releasing a sequence puts its blocks in the prefix cache last block first, so eviction takes a
// chain's tail before its head: what is left is still a prefix that can be adopted.
TEST(PagedCache, EvictionKeepsTheHeadOfAChain) {
  const auto c = one_layer();
  BlockPool pool(c, 4, 4);
  const std::vector<std::int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  {
    PagedKVCache s(pool);
    ASSERT_TRUE(s.reserve(12));
    s.commit(12);
    s.publish(tokens);
  }  // released: three cached blocks, one never used
  PagedKVCache other(pool);
  ASSERT_TRUE(other.reserve(8));  // takes the free block, then evicts one cached block
  EXPECT_EQ(pool.evictions, 1);
  PagedKVCache again(pool);
  EXPECT_EQ(again.adopt_prefix(tokens, 12), 8) << "the eviction took the head of the chain";
}

// A block is found through the block it followed: after its parent is evicted, a new block with
// the parent's tokens does not lead to it.
TEST(PagedCache, AChildIsNotFoundThroughAReplacedParent) {
  const auto c = one_layer();
  BlockPool pool(c, 3, 2);
  const std::vector<std::int32_t> tokens = {1, 2, 3, 4};
  std::int32_t child = -1;
  {
    PagedKVCache s(pool);
    ASSERT_TRUE(s.reserve(4));
    s.commit(4);
    s.publish(tokens);
    child = s.block_table()[1];
    pool.retain(child);  // keep the child cached, as another sequence holding it would
  }
  PagedKVCache filler(pool);
  ASSERT_TRUE(filler.reserve(4));  // the free block and the evicted parent
  EXPECT_EQ(pool.evictions, 1);
  PagedKVCache head(pool);  // the parent's tokens again, in another block
  filler.release();
  ASSERT_TRUE(head.reserve(2));
  head.commit(2);
  head.publish({1, 2});
  PagedKVCache again(pool);
  EXPECT_EQ(again.adopt_prefix(tokens, 4), 2) << "the child was found through a block it never followed";
  pool.release(child);
}

TEST(PagedCache, RefusalsAndErrors) {
  const auto c = one_layer();
  BlockPool pool(c, 3, 4);
  PagedKVCache s(pool);
  EXPECT_TRUE(s.reserve(12));
  s.commit(12);
  EXPECT_FALSE(s.reserve(1)) << "13 positions need a fourth block";
  EXPECT_EQ(s.block_table().size(), 3u);
  test::expect_error([&] { s.commit(1); }, {"beyond its 3 blocks"});
  test::expect_error([&] { s.truncate(13); }, {"truncate to 13 of 12"});
  test::expect_error([&] { BlockPool p(c, 0, 4); }, {"at least one block"});
  test::expect_error([&] { PagedPool p(c, 100, 16); }, {"holds no block"});
}

// Parallel samples (a request's `samples`, OpenAI's n): the prompt is computed once and forked;
// sample i gets exactly what the request alone gets with seed + i, on a paged pool (blocks shared,
// copy-on-write) and on a contiguous one (each fork computes the prompt again), and every block
// comes back.
TEST(PagedCache, ParallelSamplesShareThePromptAndEachGetsWhatItGetsAlone) {
  const models::Llama& m = tiny_mha();
  const auto text = eval::validation_tokens(kData, 400);
  ch11::Request r;
  r.id = 7;
  r.prompt.assign(text.begin() + 10, text.begin() + 10 + 37);  // two full blocks of 16 and a partly filled one
  r.max_new_tokens = 9;
  r.samples = 4;
  r.sampling.temperature = 0.9f, r.sampling.seed = 11;
  ch11::Request other = r;  // one plain request beside it, admitted in the same step
  other.id = 8, other.samples = 1, other.prompt.resize(12);
  PagedPool paged(m.config, 4 << 20, 16);
  ch11::ContiguousPool contiguous(m.config, 4 << 20, ch11::Allocation::MaxLength);
  for (ch11::KVPool* pool : {static_cast<ch11::KVPool*>(&paged), static_cast<ch11::KVPool*>(&contiguous)}) {
    ch11::EngineConfig c;
    c.scheduler = {ch11::Policy::Continuous, 6, 64};
    c.clock = ch11::Clock::Steps;
    ch11::Engine e(m, *pool, c);
    e.add(r);
    e.add(other);
    std::int64_t most_blocks = 0;
    while (e.step()) most_blocks = std::max(most_blocks, paged.blocks().used());
    ASSERT_EQ(e.finished().size(), 5u) << pool->describe();
    std::vector<int> seen(4, 0);
    for (const auto& s : e.finished()) {
      if (s->request.id == 8) {
        EXPECT_EQ(s->tokens, ch11::run_alone(m, other).tokens);
        continue;
      }
      ch11::Request alone = r;
      alone.samples = 1, alone.sampling.seed = r.sampling.seed + static_cast<std::uint64_t>(s->index);
      EXPECT_EQ(s->tokens, ch11::run_alone(m, alone).tokens) << pool->describe() << ", sample " << s->index;
      seen.at(static_cast<std::size_t>(s->index))++;
    }
    EXPECT_EQ(seen, std::vector<int>(4, 1)) << pool->describe();
    EXPECT_EQ(pool->used_bytes(), 0) << pool->describe();
    if (pool == &paged) {  // 3 prompt blocks shared; each sample writes its own third and fourth block, 1 for `other`
      EXPECT_LE(most_blocks, 3 + 4 * 2 + 2) << "the forks did not share the prompt's blocks";
    }
  }
}

// A sequence can leave early, queued, waiting or running (its client went away, a stop string
// hit): its blocks return at once and the others get what they get alone.
TEST(PagedCache, AbortedRequestsGiveTheirBlocksBackAndTheOthersAreUnchanged) {
  const models::Llama& m = tiny_mha();
  const auto text = eval::validation_tokens(kData, 400);
  PagedPool pool(m.config, 4 << 20, 16);
  ch11::EngineConfig c;
  c.scheduler = {ch11::Policy::Continuous, 3, 32};
  c.clock = ch11::Clock::Steps;
  c.keep_steps = false;
  ch11::Engine e(m, pool, c);
  std::vector<ch11::Request> rs;
  for (int i = 0; i < 5; ++i) {
    ch11::Request r;
    r.id = i;
    r.prompt.assign(text.begin() + 20 * i, text.begin() + 20 * i + 10 + i);
    r.max_new_tokens = 12;
    r.samples = i == 1 ? 2 : 1;
    r.arrival = i == 4 ? 100 : 0;  // request 4 is still to arrive when it is aborted
    rs.push_back(r);
    e.add(r);
  }
  for (int k = 0; k < 4; ++k) e.step();
  ASSERT_EQ(e.scheduler().running().size(), 3u) << "requests 0 and 1, and 1's fork";
  ASSERT_EQ(e.scheduler().waiting().size(), 2u);
  EXPECT_EQ(e.abort(1), 2) << "both samples of request 1";
  EXPECT_EQ(e.abort(2), 1) << "waiting";
  EXPECT_EQ(e.abort(4), 1) << "not yet arrived";
  EXPECT_EQ(e.abort(4), 0) << "already gone";
  const ch11::Sequence* running = e.scheduler().running().front().get();
  EXPECT_TRUE(e.finish_early(running));
  EXPECT_FALSE(e.finish_early(running));
  e.run();
  EXPECT_EQ(e.steps().size(), 1u) << "keep_steps = false keeps the last step only";
  EXPECT_EQ(pool.used_bytes(), 0);
  auto done = e.take_finished();
  EXPECT_TRUE(e.finished().empty());
  ASSERT_EQ(done.size(), 6u);
  for (const auto& s : done)
    if (s->request.id == 3) {
      EXPECT_EQ(s->tokens, ch11::run_alone(m, rs[static_cast<std::size_t>(s->request.id)]).tokens);
    }
  rs[1].arrival = e.now();
  e.add(rs[1]);  // its id is free again once taken back
  e.run();
  EXPECT_EQ(e.take_finished().size(), 2u);
}
