#include "common/models/mla.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <random>

#include "common/json_file.h"
#include "common/lab.h"
#include "common/models/cuda_mla.h"
#include "common/models/hf_weights.h"
#include "common/models/mla_gguf.h"

namespace inferlab::models::mla {

float MlaConfig::softmax_scale() const {
  return static_cast<float>(softmax_mscale / std::sqrt(static_cast<double>(qk_head_dim())));
}

MlaCost mla_cost(const MlaConfig& c, std::int64_t D, std::int64_t N, std::int64_t T, std::int64_t S, MlaPath path,
                 std::int64_t cache_value_bytes) {
  const double dn = static_cast<double>(c.qk_nope_head_dim), dr = static_cast<double>(c.qk_rope_head_dim),
               dv = static_cast<double>(c.v_head_dim), r = static_cast<double>(c.kv_lora_rank),
               rq = static_cast<double>(c.q_lora_rank), d = static_cast<double>(D), n = static_cast<double>(N),
               t = static_cast<double>(T);
  const double rows = static_cast<double>(S + T);  // every cached row, the new ones included
  // Causal: new row i (position S + i) sees S + i + 1 keys.
  const double visible = t * static_cast<double>(S) + t * (t + 1) / 2;
  MlaCost cost;
  const double q_flops = c.q_lora_rank ? 2 * t * d * rq + 2 * t * rq * n * (dn + dr) : 2 * t * d * n * (dn + dr);
  cost.projection_flops = q_flops + 2 * t * d * (r + dr) + 2 * t * n * dv * d;
  cost.cache_bytes = rows * (r + dr) * static_cast<double>(cache_value_bytes);
  // EXERCISE 04.3 BEGIN: the FLOPs that read the cache, plain and absorbed
  if (path == MlaPath::Plain) {
    cost.cache_flops = 2 * rows * r * n * (dn + dv)         // rebuild k_nope and v of every row
                       + 2 * visible * n * (dn + dr + dv);  // attention with Dqk = dn + dr, Dv = dv
    cost.rebuilt_bytes = 2 * rows * n * (dn + dr + dv) * 4;
  } else {
    cost.cache_flops = 2 * t * n * dn * r + 2 * t * n * r * dv  // fold W_UK into q, W_UV into the output
                       + 2 * visible * n * (r + dr + r);        // attention with Dqk = r + dr, Dv = r
  }
  // EXERCISE 04.3 STUB
  // (void)visible, (void)dn, (void)dr, (void)dv, (void)r, (void)n, (void)t;
  // lab::not_done("04.3", "set cost.cache_flops: for the plain path the rebuild (every one of the S + T rows "
  //                       "times W_KVB) plus attention with Dqk = dn + dr and Dv = dv over `visible` keys per "
  //                       "head, and rebuilt_bytes (K and V written and read, f32); for the absorbed path the "
  //                       "two folds of the T new rows plus attention with Dqk = r + dr and Dv = r");
  // EXERCISE 04.3 END
  return cost;
}

double crossover_rows(const MlaConfig& c) {
  const double r = static_cast<double>(c.kv_lora_rank), w = static_cast<double>(c.qk_nope_head_dim + c.v_head_dim);
  return 2 * r > w ? r * w / (2 * r - w) : std::numeric_limits<double>::infinity();
}

// ---------------------------------------------------------------------------------------------
// The attention block. Chapter 02's attention_block with MLA's projections; the lines marked
// "MLA" are where it differs.
namespace {

// q [T, N, dn + dr] from the normed rows h.
Tensor project_q(const MlaModel& m, const MlaAttention& a, const Tensor& h) {
  const std::int64_t T = h.size(0), N = m.config().num_heads;
  const Tensor q = a.wq.defined() ? linear(h, a.wq)
                                  : linear(ops::rmsnorm(linear(h, a.wq_a), a.q_a_norm, MlaConfig::kLatentNormEps), a.wq_b);
  return q.view({T, N, m.mla.qk_head_dim()});
}

// [..., da] and [..., db] side by side: [..., da + db] (CPU; the chapter's forward pass runs there).
Tensor cat_last(const Tensor& a, const Tensor& b) {
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  const std::int64_t da = a.size(-1), db = b.size(-1), M = a.numel() / da;
  Shape s = a.shape();
  s.back() = da + db;
  Tensor y = Tensor::empty(s, DType::F32);
  for (std::int64_t m = 0; m < M; ++m) {
    std::copy_n(ac.data<float>() + m * da, da, y.data<float>() + m * (da + db));
    std::copy_n(bc.data<float>() + m * db, db, y.data<float>() + m * (da + db) + da);
  }
  return y;
}

// Per-head matmul: x [T, N, in] (head h's slice) times w[h]ᵀ, w[h] [out, in] -> [T, N, out].
Tensor per_head(const Tensor& x, const std::vector<Tensor>& w, std::int64_t out_dim) {
  const std::int64_t T = x.size(0), N = x.size(1);
  Tensor y = Tensor::empty({T, N, out_dim}, DType::F32);
  for (std::int64_t h = 0; h < N; ++h) {
    const Tensor yh = ops::matmul(x.slice(1, h, h + 1).contiguous().view({T, x.size(2)}), w[static_cast<std::size_t>(h)]);
    for (std::int64_t t = 0; t < T; ++t)
      std::copy_n(yh.data<float>() + t * out_dim, out_dim, y.data<float>() + (t * N + h) * out_dim);
  }
  return y;
}

// x [S, d] repeated for N heads: [S, N, d] (the one k_pe every head shares, made explicit).
Tensor repeat_heads(const Tensor& x, std::int64_t N) {
  const Tensor xc = x.contiguous();
  const std::int64_t S = x.size(0), d = x.size(1);
  Tensor y = Tensor::empty({S, N, d}, DType::F32);
  for (std::int64_t s = 0; s < S; ++s)
    for (std::int64_t n = 0; n < N; ++n) std::copy_n(xc.data<float>() + s * d, d, y.data<float>() + (s * N + n) * d);
  return y;
}

}  // namespace

Tensor attention_block(const MlaModel& m, const MlaAttention& a, const Tensor& h, const models::Batch& batch,
                       std::int64_t layer, MlaPath path) {
  const MlaConfig& c = m.mla;
  const std::int64_t T = h.size(0), N = m.config().num_heads, dn = c.qk_nope_head_dim, dv = c.v_head_dim, r = c.kv_lora_rank,
                     R = c.latent_dim();
  IL_CHECK(h.device() == Device::CPU, "MLA attention block: runs on the CPU only (chapter 04 has no CUDA path yet)");
  Tensor q = project_q(m, a, h);         // MLA: [T, N, dn + dr]
  const Tensor kv = linear(h, a.wkv_a);  // MLA: [T, r + dr], one row per token, all heads
  const Tensor c_kv = ops::rmsnorm(kv.slice(1, 0, r).contiguous(), a.kv_a_norm, MlaConfig::kLatentNormEps);  // MLA: [T, r]
  Tensor k_pe = kv.slice(1, r, R).contiguous().view({T, 1, R - r});   // MLA: [T, 1, dr]
  ops::rope(q, batch.pos, m.base.inv_freq, m.base.rope_pairing, dn);  // MLA: only the trailing dr dims rotate
  ops::rope(k_pe, batch.pos, m.base.inv_freq, m.base.rope_pairing);
  const Tensor latent_rows = cat_last(c_kv, k_pe.view({T, R - r}));  // [T, r + dr]: what the cache keeps
  Tensor o = Tensor::empty({T, N, dv}, DType::F32);
  for (std::size_t b = 0; b < batch.caches.size(); ++b) {
    const std::int64_t r0 = batch.begin[b], r1 = batch.begin[b + 1], Tb = r1 - r0;
    const Tensor qb = q.slice(0, r0, r1);
    Tensor ob = o.slice(0, r0, r1);
    if (path == MlaPath::Plain) {
      // Rebuild every cached position's K and V from its latent row, then attend as MHA does.
      LatentCache& cache = batch.cache<LatentCache>(b, "a LatentCache (the plain path rebuilds K and V from its rows)");
      const Tensor rows = cache.append(layer, latent_rows.slice(0, r0, r1));  // [S, r + dr]
      const std::int64_t S = rows.size(0);
      const Tensor up = linear(rows.slice(1, 0, r).contiguous(), a.wkv_b).view({S, N, dn + dv});  // [k_nope ‖ v] per head
      const Tensor k = cat_last(up.slice(2, 0, dn), repeat_heads(rows.slice(1, r, R), N));        // [S, N, dn + dr]
      const Tensor v = up.slice(2, dn, dn + dv).contiguous();                                     // [S, N, dv]
      AttentionParams p;
      p.q_offset = S - Tb;
      p.scale = c.softmax_scale();
      ops::attention(qb, k, v, ob, p);
    } else {
      models::KVCache& cache = batch.cache<models::KVCache>(b, "a cache of latent rows");  // a LatentCache, or paged
      // EXERCISE 04.2 BEGIN: absorbed attention: fold W_UK into the query, W_UV into the output
      // q_lat = q_nope · W_UK per head, next to q_pe: a query in the latent rows' own space.
      const Tensor ql =
          cat_last(per_head(qb.slice(2, 0, dn), a.uk_t, r), qb.slice(2, dn, c.qk_head_dim()));  // [Tb, N, r + dr]
      const Tensor kb = latent_rows.slice(0, r0, r1).view({Tb, 1, R});
      Tensor ol = Tensor::empty({Tb, N, r}, DType::F32);
      cache.attend(layer, ql, kb, kb.slice(2, 0, r), ol);  // one KV head: the rows are keys, their c part values
      ob.copy_from(per_head(ol, a.uv, dv));                // out_h = W_UV o_lat, per head
      // EXERCISE 04.2 STUB
      // (void)&per_head, (void)cache;
      // lab::not_done("04.2", "turn each head's q_nope into latent space with per_head(·, a.uk_t, r) and put q_pe "
      //                       "after it (cat_last); let cache.attend store this sequence's latent rows (k = the rows "
      //                       "[Tb, 1, r + dr], v = their first r columns) and attend into a [Tb, N, r] output; bring "
      //                       "that back to [Tb, N, dv] with per_head(·, a.uv, dv) into ob");
      // EXERCISE 04.2 END
    }
  }
  return linear(o.view({T, N * dv}), a.wo);
}

// Chapter 02's batch step, with the MLA block in each layer's attention.
Tensor forward(const MlaModel& m, std::vector<models::SequenceStep>& seqs, MlaPath path) {
  return models::forward(
      m.base, seqs,
      [&](const models::Llama&, const models::LlamaLayer&, const Tensor& h, const models::Batch& batch, std::int64_t layer) {
    return attention_block(m, m.attn[static_cast<std::size_t>(layer)], h, batch, layer, path);
      });
}

Tensor forward_cached(const MlaModel& m, LatentCache& cache, const std::vector<std::int32_t>& tokens, bool all_positions,
                      MlaPath path) {
  std::vector<models::SequenceStep> one{{tokens, &cache, all_positions}};
  return forward(m, one, path);
}

models::Generation generate_cached(const MlaModel& m, const std::vector<std::int32_t>& prompt, int max_new, Sampler& sampler,
                                   const std::vector<std::int64_t>& eos_ids, MlaPath path, const models::OnToken& on_token) {
  return models::generate_with_cache(
      m.config().max_position_embeddings, m.base.device(), prompt, max_new, sampler, eos_ids, on_token,
      [&](std::int64_t capacity) { return LatentCache(m.config(), m.mla, capacity, m.base.device()); },
      [&](LatentCache& cache, const std::vector<std::int32_t>& feed) {
    return forward_cached(m, cache, feed, false, path);
      });
}

// ---------------------------------------------------------------------------------------------
// The latent cache.
LatentCache::LatentCache(const TransformerConfig& c, const MlaConfig& mla, std::int64_t capacity, Device device, DType dtype)
    : RowCache("latent cache", capacity), mla_(mla), layers_(c.num_layers), dtype_(dtype) {
  const std::int64_t total = bytes();
  with_context(
      [&] { return "latent cache of " + std::to_string(capacity) + " positions (" + std::to_string(total) + " bytes)"; },
      [&] {
    for (std::int64_t l = 0; l < c.num_layers; ++l)
      rows_.push_back(Tensor::zeros({capacity, 1, mla.latent_dim()}, dtype, device));
      });
}

Tensor LatentCache::store(std::int64_t layer, const Tensor& rows) {
  IL_CHECK(layer >= 0 && layer < static_cast<std::int64_t>(rows_.size()), "latent cache: no layer ", layer);
  IL_CHECK(rows.ndim() >= 2 && rows.size(-1) == mla_.latent_dim(), "latent cache: rows must be [T, ", mla_.latent_dim(),
           "] (r + dr), got ", rows.describe());
  const std::int64_t start = length_, end = end_of_step(rows.size(0));
  rows_[static_cast<std::size_t>(layer)].slice(0, start, end).copy_from(rows.view({rows.size(0), 1, mla_.latent_dim()}));
  return rows_[static_cast<std::size_t>(layer)].slice(0, 0, end);
}

Tensor LatentCache::append(std::int64_t layer, const Tensor& rows) {
  const Tensor all = store(layer, rows.contiguous());
  return all.view({all.size(0), mla_.latent_dim()});
}

void LatentCache::attend(std::int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out) {
  const std::int64_t r = mla_.kv_lora_rank;
  IL_CHECK(k.ndim() == 3 && k.size(1) == 1, "latent cache: k must be the new latent rows [T, 1, r + dr], got ",
           k.describe());
  IL_CHECK(v.ndim() == 3 && v.size(0) == k.size(0) && v.size(1) == 1 && v.size(2) == r,
           "latent cache: v must be the first r = ", r, " columns of k's rows [T, 1, r], got ", v.describe());
  const std::int64_t start = length_;
  const Tensor all = store(layer, k.contiguous());  // v is part of k's row: stored with it
  if (all.is_cuda() && q.size(0) == 1) {  // one decode row on the GPU: the kernel reads each row once for all heads
    mla_decode_attention(q.contiguous(), all, all.size(0), mla_.softmax_scale(), r, out);
    return;
  }
  AttentionParams p;
  p.q_offset = start;
  p.scale = mla_.softmax_scale();  // the score is a (dn + dr)-dim dot product, computed in latent space
  // The value is the first r columns of each row (ops::attention wants contiguous tensors, so a
  // CPU copy; a kernel reads them in place).
  ops::attention(q, all, all.slice(2, 0, r).contiguous(), out, p);
}

std::int64_t LatentCache::bytes() const {
  return checked_mul(
      capacity_,
      checked_mul(mla_.latent_dim() * layers_, static_cast<std::int64_t>(dtype_size(dtype_)), "latent-cache bytes"),
      "latent-cache bytes");
}

void LatentCache::release() {
  rows_.clear();
  capacity_ = length_ = layers_ = 0;
}

Tensor LatentCache::rows(std::int64_t layer) const { return rows_.at(static_cast<std::size_t>(layer)); }

// ---------------------------------------------------------------------------------------------
// Loading.
void absorb(const MlaConfig& mla, std::int64_t N, MlaAttention& a) {
  IL_CHECK(!a.wkv_b.packed, "MLA: the absorbed path needs kv_b_proj as a plain matrix");
  const std::int64_t dn = mla.qk_nope_head_dim, dv = mla.v_head_dim, r = mla.kv_lora_rank;
  const Tensor w = a.wkv_b.weight.to(Device::CPU).to(DType::F32);  // [N·(dn+dv), r]
  a.uk_t.clear(), a.uv.clear();
  for (std::int64_t h = 0; h < N; ++h) {
    Tensor uk_t = Tensor::empty({r, dn}, DType::F32), uv = Tensor::empty({dv, r}, DType::F32);
    // EXERCISE 04.1 BEGIN: W_UK and W_UV of one head, out of kv_b_proj
    const std::int64_t row = h * (dn + dv);  // head h's rows: dn of W_UK, then dv of W_UV
    for (std::int64_t i = 0; i < dn; ++i)
      for (std::int64_t j = 0; j < r; ++j) uk_t.at<float>({j, i}) = w.at<float>({row + i, j});
    uv.copy_from(w.slice(0, row + dn, row + dn + dv));
    // EXERCISE 04.1 STUB
    // (void)w;
    // lab::not_done("04.1", "fill uk_t [r, dn] with head h's W_UK transposed and uv [dv, r] with its W_UV; in w "
    //                       "[N·(dn + dv), r], head h owns rows h·(dn + dv) .. (h + 1)·(dn + dv) − 1, first the dn "
    //                       "rows of W_UK, then the dv rows of W_UV");
    // EXERCISE 04.1 END
    a.uk_t.push_back(uk_t.to(a.wkv_b.device()));
    a.uv.push_back(uv.to(a.wkv_b.device()));
  }
}

MlaConfig parse_mla_config(const HfConfig& hf, const TransformerConfig& c) {
  const JsonFields f(hf.json, hf.path);
  const bool v2 = c.architecture == "DeepseekV2ForCausalLM";
  MlaConfig m;
  m.kv_lora_rank = f.get<std::int64_t>("kv_lora_rank");
  m.qk_nope_head_dim = f.get<std::int64_t>("qk_nope_head_dim");
  m.qk_rope_head_dim = f.get<std::int64_t>("qk_rope_head_dim");
  m.v_head_dim = f.get<std::int64_t>("v_head_dim");
  if (f.has("q_lora_rank")) m.q_lora_rank = f.get<std::int64_t>("q_lora_rank");
  // DeepseekV3Config's default is true; DeepseekV2 always rotates adjacent pairs (as complex
  // numbers) and has no such field.
  m.rope_interleave = v2 || f.get_or<bool>("rope_interleave", true);
  for (auto [name, v] : {std::pair<const char*, std::int64_t>{"kv_lora_rank", m.kv_lora_rank},
                         {"qk_nope_head_dim", m.qk_nope_head_dim},
                         {"qk_rope_head_dim", m.qk_rope_head_dim},
                         {"v_head_dim", m.v_head_dim}})
    IL_CHECK(v > 0 && v <= (1 << 16), hf.path, ": field '", name, "' must be in [1, 65536], got ", v);
  IL_CHECK(f.get_or<std::int64_t>("q_lora_rank", 1) > 0 && m.q_lora_rank <= (1 << 16), hf.path,
           ": field 'q_lora_rank' must be null or in [1, 65536], got ", hf.json["q_lora_rank"].dump());
  IL_CHECK(m.qk_rope_head_dim % 2 == 0, hf.path, ": field 'qk_rope_head_dim' (", m.qk_rope_head_dim,
           ") must be even for RoPE");
  if (f.has("qk_head_dim"))
    IL_CHECK(f.get<std::int64_t>("qk_head_dim") == m.qk_head_dim(), hf.path, ": field 'qk_head_dim' (",
             f.get<std::int64_t>("qk_head_dim"), ") is not qk_nope_head_dim + qk_rope_head_dim (", m.qk_head_dim(), ")");
  // transformers rotates config.head_dim dims, which DeepseekV3Config sets to qk_rope_head_dim.
  if (f.has("head_dim"))
    IL_CHECK(c.head_dim == m.qk_rope_head_dim, hf.path, ": field 'head_dim' (", c.head_dim,
             ") differs from qk_rope_head_dim (", m.qk_rope_head_dim, "); the rotary width would be ambiguous");
  // rope_scaling: YaRN (DeepSeek's long-context configs) is implemented; other types are refused.
  if (!c.rope_scaling.is_null()) {
    const JsonFields s(c.rope_scaling, hf.path + ": field 'rope_scaling'");
    const std::string type = s.get_or<std::string>("rope_type", s.get_or<std::string>("type", ""));
    IL_CHECK(type == "yarn", s.context(), ": type '", type,
             "' is not implemented in chapter 04 (only 'yarn', as DeepSeek uses)");
    m.yarn = parse_yarn_scaling(c, hf.path);
    m.rope_attention_factor = yarn_attention_factor(*m.yarn);
    // DeepseekV3Attention: scale · yarn_mscale(factor, mscale_all_dim)² when mscale_all_dim is set.
    // transformers' DeepseekV2Attention keeps 1/sqrt(dn + dr), where DeepSeek's own V2 code
    // applies the same mscale² as V3: a V2 config with mscale_all_dim is refused.
    IL_CHECK(!v2 || m.yarn->mscale_all_dim == 0, s.context(), ": 'mscale_all_dim' is ", m.yarn->mscale_all_dim,
             "; transformers' DeepseekV2ForCausalLM ignores it (its softmax scale stays 1/sqrt(dn + dr)) while "
             "DeepseekV3 and DeepSeek's own code scale the softmax by yarn_mscale(factor, mscale_all_dim)^2, so "
             "chapter 04 does not pick one");
    if (m.yarn->mscale_all_dim != 0) {
      const double ms = yarn_mscale(m.yarn->factor, m.yarn->mscale_all_dim);
      m.softmax_mscale = ms * ms;
    }
  }
  IL_CHECK(!c.attention_bias, hf.path, ": field 'attention_bias' is true; chapter 04's MLA projections have no biases");
  IL_CHECK(!v2 || !c.mlp_bias, hf.path, ": field 'mlp_bias' is true; chapter 04's MLPs have no biases");
  // The MoE layers (from first_k_dense_replace on) are the core's: parse_transformer_config read
  // them into c.moe (common/moe_config.h) and models::read_decoder reads their experts.
  IL_CHECK(f.get_or<std::int64_t>("pretraining_tp", 1) == 1, hf.path, ": field 'pretraining_tp' is not 1");
  return m;
}

namespace {

// w [rows, in] as F32 with rows [begin, begin + n) of every block of `period` rows multiplied by
// `factor`: YaRN's cos/sin factor moved into the rows that produce q_pe and k_pe (see the note).
Tensor scale_rope_rows(const Tensor& w, std::int64_t period, std::int64_t begin, std::int64_t n, double factor) {
  if (factor == 1) return w;
  Tensor y = w.to(DType::F32);  // a copy: the checkpoint's tensor stays as read
  const std::int64_t in = y.size(1);
  for (std::int64_t row = 0; row < y.size(0); ++row)
    if (row % period >= begin && row % period < begin + n)
      for (std::int64_t j = 0; j < in; ++j) y.data<float>()[row * in + j] *= static_cast<float>(factor);
  return y;
}

}  // namespace

// Chapter 01's decoder (embedding, norms, MLPs, head) with MLA attention read into m.attn.
MlaModel assemble_mla(const TransformerConfig& c, const MlaConfig& mla, const TensorGetter& get) {
  const std::int64_t D = c.hidden_size, N = c.num_heads, r = mla.kv_lora_rank, Q = N * mla.qk_head_dim();
  const std::int64_t dn = mla.qk_nope_head_dim, dr = mla.qk_rope_head_dim, dq = mla.qk_head_dim();
  const double af = mla.rope_attention_factor;
  MlaModel m;
  m.mla = mla;
  m.base = models::read_decoder(c, get, [&](const std::string& p, std::int64_t, models::LlamaLayer&) {
    MlaAttention a;  // the layer's own wq/wk/wv/wo stay undefined
    const std::string s = p + "self_attn.";
    // Each head's q rows are [q_nope (dn) ‖ q_pe (dr)]; kv_a's rows are [c (r) ‖ kp (dr)].
    if (mla.q_lora_rank == 0) {
      a.wq = scale_rope_rows(get(s + "q_proj.weight", Shape{Q, D}), dq, dn, dr, af);
    } else {
      a.wq_a = get(s + "q_a_proj.weight", Shape{mla.q_lora_rank, D});
      a.q_a_norm = get(s + "q_a_layernorm.weight", Shape{mla.q_lora_rank}).to(DType::F32);
      a.wq_b = scale_rope_rows(get(s + "q_b_proj.weight", Shape{Q, mla.q_lora_rank}), dq, dn, dr, af);
    }
    a.wkv_a = scale_rope_rows(get(s + "kv_a_proj_with_mqa.weight", Shape{mla.latent_dim(), D}), mla.latent_dim(), r, dr, af);
    a.kv_a_norm = get(s + "kv_a_layernorm.weight", Shape{r}).to(DType::F32);
    a.wkv_b = get(s + "kv_b_proj.weight", Shape{N * (mla.qk_nope_head_dim + mla.v_head_dim), r});
    a.wo = get(s + "o_proj.weight", Shape{D, N * mla.v_head_dim});
    absorb(mla, N, a);
    m.attn.push_back(a);
  });
  // The frequencies of the dr rotary dims (YaRN's when the config asks for it).
  m.base.inv_freq = mla.yarn ? yarn_inv_freq(dr, c.rope_theta, *mla.yarn) : rope_inv_freq(dr, c.rope_theta);
  m.base.rope_pairing = mla.rope_interleave ? RopePairing::Adjacent : RopePairing::HalfSplit;
  return m;
}

MlaModel load_mla(const std::string& path) {
  if (std::filesystem::path(path).extension() == ".gguf") return load_mla_gguf(path);
  const HfConfig hf = load_hf_config(path);
  // DeepseekV2's dense layer is V3's with adjacent-pair RoPE and no YaRN softmax mscale
  // (parse_mla_config refuses the configs where that would differ).
  IL_CHECK(hf.architecture() == "DeepseekV3ForCausalLM" || hf.architecture() == "DeepseekV2ForCausalLM", hf.path,
           ": architecture '", hf.architecture(),
           "' is not DeepseekV3ForCausalLM or DeepseekV2ForCausalLM, the MLA models chapter 04 runs");
  const TransformerConfig c = parse_transformer_config(hf);
  const MlaConfig mla = parse_mla_config(hf, c);
  models::HfWeights weights(hf, c, path);
  MlaModel m = assemble_mla(c, mla, std::ref(weights));
  weights.check_all_used("a multi-token-prediction layer, or num_hidden_layers too small?");
  m.base.source = path;
  return m;
}

MlaModel random_mla(const TransformerConfig& c, const MlaConfig& mla, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto fill = [&](const Shape& s, float lo, float hi) {
    std::uniform_real_distribution<float> dist(lo, hi);
    Tensor t = Tensor::empty(s, DType::F32);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
    return t;
  };
  MlaModel m = assemble_mla(c, mla, [&](const std::string& n, const Shape& s) {
    if (s.size() == 1) return fill(s, 0.8f, 1.2f);  // a norm
    const float a = 1.0f / std::sqrt(static_cast<float>(s[1]));
    (void)n;
    return fill(s, -a, a);
  });
  m.base.source = "random weights, seed " + std::to_string(seed);
  return m;
}

}  // namespace inferlab::models::mla
