// Chapter 02's decode step on the GPU: bf16 weight streaming, fused kernels, split-K attention
// over the cache, one CUDA graph per token. See cuda_decode.h for the plan.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "chapters/02_kv_cache/cuda_decode.h"
#include "common/cuda/backend.h"
#include "common/cuda/decode_attention.cuh"
#include "common/cuda/gemv.cuh"
#include "common/cuda/util.cuh"

namespace inferlab::ch02 {

namespace {

using bf16 = __nv_bfloat16;
using cuda::blocks_for;
using cuda::stream;

// --- small kernels -----------------------------------------------------------------------------
__global__ void embed(const bf16* __restrict__ table, const int* __restrict__ token, float* __restrict__ x, int D) {
  const bf16* row = table + static_cast<long long>(*token) * D;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < D; i += gridDim.x * blockDim.x) x[i] = __bfloat162float(row[i]);
}

// RoPE on q (N heads) and k (K heads) at the current position, then k and v into the cache.
__global__ void rope_and_store(float* __restrict__ qkv, const float* __restrict__ inv_freq, const int* __restrict__ pos_p,
                               float* __restrict__ kc, float* __restrict__ vc, int N, int Kh, int H, int half,
                               bool adjacent) {
  const int pos = *pos_p, pairs = (N + Kh) * half, vn = Kh * H;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  float* q = qkv;
  float* k = qkv + N * H;
  const float* v = k + Kh * H;
  if (i < pairs) {
    const int head = i / half, j = i % half;
    float* row = head < N ? q + head * H : k + (head - N) * H;
    const int ia = adjacent ? 2 * j : j, ib = adjacent ? 2 * j + 1 : j + half;
    double s, c;
    sincos(static_cast<double>(pos) * static_cast<double>(inv_freq[j]), &s, &c);
    const float a = row[ia], b = row[ib], cf = static_cast<float>(c), sf = static_cast<float>(s);
    const float ra = a * cf - b * sf, rb = a * sf + b * cf;
    row[ia] = ra, row[ib] = rb;
    if (head >= N) {
      float* dst = kc + (static_cast<long long>(pos) * Kh + (head - N)) * H;
      dst[ia] = ra, dst[ib] = rb;
    }
    if (head >= N && 2 * half < H && j == 0)  // dimensions past the rotary ones
      for (int d = 2 * half; d < H; ++d) kc[(static_cast<long long>(pos) * Kh + (head - N)) * H + d] = row[d];
  } else if (i < pairs + vn) {
    const int e = i - pairs;
    vc[static_cast<long long>(pos) * vn + e] = v[e];
  }
}

// The greedy choice on the device: argmax (first index of the maximum, as ops::argmax) becomes
// the next step's input token; the position advances.
__global__ void argmax_and_advance(const float* __restrict__ logits, int V, int* token, int* pos, int* log) {
  const int best = cuda::block_argmax(logits, V);
  if (threadIdx.x == 0) {
    *token = best;
    log[*pos] = best;
    *pos += 1;
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
struct CudaDecoder::Impl {
  const models::Llama& m;
  models::ContiguousKVCache cache;
  bool use_graph;
  std::int64_t N, Kh, H, D, F, V;
  int splits;
  Tensor token, pos, log, x, h, qkv, attn, hid, logits, part;
  cudaGraphExec_t graph = nullptr;
  bool greedy_graph = false;
  // The GEMV version (cuda::gemv_version() when constructed) and whether each RMSNorm is folded
  // into the product after it (version 3, where the hidden state fits in a block's shared memory).
  // `plain` is the version of the products with no RMSNorm before them (version 3 is 2 there).
  cuda::GemvVersion gemv, plain;
  bool fuse_norm = false;

  Impl(const models::Llama& model, std::int64_t capacity, bool graph)
      : m(model),
        cache(model.config, capacity, Device::CUDA),
        use_graph(graph),
        gemv(cuda::gemv_version()),
        plain(gemv == cuda::GemvVersion::WarpRow ? gemv : cuda::GemvVersion::SharedX) {
    const auto& c = m.config;
    bool plain_bf16 = m.device() == Device::CUDA && m.weight_dtype() == DType::BF16 && !m.lm_head.packed;
    for (const auto& l : m.layers)
      for (const Linear* w : l.linears()) plain_bf16 = plain_bf16 && !w->packed && w->weight.dtype() == DType::BF16;
    IL_CHECK(plain_bf16,
             "CudaDecoder: the model must be on CUDA with plain bf16 weights (Llama::to(Device::CUDA, DType::BF16))");
    N = c.num_heads, Kh = c.num_kv_heads, H = c.head_dim, D = c.hidden_size, F = c.intermediate_size, V = c.vocab_size;
    IL_CHECK(H <= cuda::decode::kMaxHead, "CudaDecoder: head dimension ", H, " is above the kernel's limit of ",
             cuda::decode::kMaxHead);
    for (const auto& l : m.layers)
      IL_CHECK(!l.w_gate.bias.defined() && !l.w_up.bias.defined(),
               "CudaDecoder: the fused gate/up kernel has no biases (mlp_bias); decode this model with the cached "
               "forward pass (generate_cached)");
    for (const auto& l : m.layers)
      IL_CHECK(!l.q_norm.defined() && !l.post_attn_norm.defined() && !l.geglu && !l.inv_freq.defined(),
               "CudaDecoder: its fused kernels have no per-head q/k norms (Qwen3, Gemma 3) nor Gemma's post-block "
               "norms and GeGLU; decode this model with the cached forward pass (generate_cached)");
    IL_CHECK(c.embed_scale == 1.0 && c.final_logit_softcapping == 0 && c.attn_logit_softcapping == 0 &&
                 c.query_pre_attn_scalar == 0,
             "CudaDecoder: Gemma's embedding scale, attention scale and soft-capping are not in its kernels; decode "
             "this model with the cached forward pass (generate_cached)");
    splits = cuda::decode::splits_for(capacity);
    fuse_norm = gemv == cuda::GemvVersion::NormFused && cuda::gemv_stages(D);
    auto f32 = [](Shape s) { return Tensor::zeros(s, DType::F32, Device::CUDA); };
    token = Tensor::zeros({1}, DType::I32, Device::CUDA), pos = Tensor::zeros({1}, DType::I32, Device::CUDA);
    log = Tensor::zeros({capacity}, DType::I32, Device::CUDA);
    x = f32({D}), h = f32({D}), qkv = f32({(N + 2 * Kh) * H}), attn = f32({N * H}), hid = f32({F});
    logits = f32({1, V}), part = f32({cuda::decode::part_floats(N, splits, H)});
  }

  ~Impl() {
    if (graph) cudaGraphExecDestroy(graph);
  }

  using Segments = cuda::GemvSegments<bf16>;
  static const float* bias(const Tensor& b) { return b.defined() ? b.data<float>() : nullptr; }
  static Segments one(const Linear& w, std::int64_t rows) {
    return Segments{{static_cast<const bf16*>(w.weight.raw_data()), nullptr, nullptr},
                    {bias(w.bias), nullptr, nullptr},
                    {static_cast<int>(rows), 0, 0},
                    1};
  }

  // y = W·in (+ bias), or y += W·in (+ bias).
  void product(const Segments& s, const float* in, float* y, std::int64_t K, bool accumulate) {
    cuda::launch_gemv(plain, s, in, y, K, accumulate);
  }

  // y = W·rmsnorm(x) (+ bias): one launch with version 3, else the norm into h, then the product.
  void normed_product(const Tensor& norm, const Segments& s, float* y, float eps) {
    if (fuse_norm) return cuda::launch_gemv(gemv, s, x.data<float>(), y, D, false, norm.data<float>(), eps);
    cuda::rmsnorm_rows<float><<<1, 1024, 0, stream()>>>(x.data<float>(), norm.data<float>(), h.data<float>(), D, eps);
    IL_CUDA_LAUNCHED();
    product(s, h.data<float>(), y, D, false);
  }

  // The whole decode step, as a sequence of launches on stream(): captured once into a graph.
  void enqueue_step(bool greedy) {
    const auto& c = m.config;
    const float eps = static_cast<float>(c.rms_norm_eps), scale = 1.0f / std::sqrt(static_cast<float>(H));
    const int half = static_cast<int>(m.inv_freq.numel());
    embed<<<blocks_for(D, 256), 256, 0, stream()>>>(static_cast<const bf16*>(m.embed.raw_data()), token.data<std::int32_t>(),
                                                    x.data<float>(), static_cast<int>(D));
    IL_CUDA_LAUNCHED();
    for (std::size_t li = 0; li < m.layers.size(); ++li) {
      const auto& l = m.layers[li];
      const Segments qkv_s{{static_cast<const bf16*>(l.wq.weight.raw_data()),
                            static_cast<const bf16*>(l.wk.weight.raw_data()),
                            static_cast<const bf16*>(l.wv.weight.raw_data())},
                           {bias(l.wq.bias), bias(l.wk.bias), bias(l.wv.bias)},
                           {static_cast<int>(N * H), static_cast<int>(Kh * H), static_cast<int>(Kh * H)},
                           3};
      normed_product(l.attn_norm, qkv_s, qkv.data<float>(), eps);
      const long long work = (N + Kh) * half + Kh * H;
      rope_and_store<<<blocks_for(work, 256), 256, 0, stream()>>>(
          qkv.data<float>(), m.inv_freq.data<float>(), pos.data<std::int32_t>(), cache.k(li).data<float>(),
          cache.v(li).data<float>(), static_cast<int>(N), static_cast<int>(Kh), static_cast<int>(H), half,
          m.rope_pairing == RopePairing::Adjacent);
      IL_CUDA_LAUNCHED();
      // Decode attention, version 1 of the family (common/cuda/decode_attention.cuh) and its merge.
      cuda::decode::launch_per_head(qkv.data<float>(), cache.k(li).data<float>(), cache.v(li).data<float>(),
                                    pos.data<std::int32_t>(), part.data<float>(), attn.data<float>(), static_cast<int>(N),
                                    static_cast<int>(Kh), static_cast<int>(H), splits, scale, stream());
      product(one(l.wo, D), attn.data<float>(), x.data<float>(), N * H, true);  // x += Wo·attn + bo
      const bf16* wg = static_cast<const bf16*>(l.w_gate.weight.raw_data());
      const bf16* wu = static_cast<const bf16*>(l.w_up.weight.raw_data());
      if (fuse_norm) {  // hid = silu(Wg·rmsnorm(x)) · (Wu·rmsnorm(x)), the norm in the product's prologue
        cuda::launch_gemv_swiglu(gemv, wg, wu, x.data<float>(), hid.data<float>(), F, D, l.mlp_norm.data<float>(), eps);
      } else {
        cuda::rmsnorm_rows<float>
            <<<1, 1024, 0, stream()>>>(x.data<float>(), l.mlp_norm.data<float>(), h.data<float>(), D, eps);
        IL_CUDA_LAUNCHED();
        cuda::launch_gemv_swiglu(plain, wg, wu, h.data<float>(), hid.data<float>(), F, D);
      }
      product(one(l.w_down, D), hid.data<float>(), x.data<float>(), F, true);  // x += Wdown·hid
    }
    normed_product(m.final_norm, one(m.lm_head, V), logits.data<float>(), eps);
    // Greedy steps choose the next token and advance the position on the device; step() sets
    // both from the host before each launch instead.
    if (greedy) {
      argmax_and_advance<<<1, 1024, 0, stream()>>>(logits.data<float>(), static_cast<int>(V), token.data<std::int32_t>(),
                                                   pos.data<std::int32_t>(), log.data<std::int32_t>());
      IL_CUDA_LAUNCHED();
    }
  }

  void run_step(bool greedy) {
    IL_CHECK(cache.length() < cache.capacity(), "KV cache full: ", cache.length(), " positions of ", cache.capacity());
    if (!use_graph) {
      enqueue_step(greedy);
    } else {
      if (!graph || greedy_graph != greedy) {
        if (graph) IL_CUDA(cudaGraphExecDestroy(graph));
        graph = nullptr;
        cudaGraph_t g = nullptr;
        IL_CUDA(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal));
        try {
          enqueue_step(greedy);
        } catch (...) {  // end the capture, or every later call on the stream fails
          if (cudaStreamEndCapture(stream(), &g) == cudaSuccess && g) cudaGraphDestroy(g);
          throw;
        }
        IL_CUDA(cudaStreamEndCapture(stream(), &g));
        const cudaError_t e = cudaGraphInstantiate(&graph, g, 0);
        cudaGraphDestroy(g);
        IL_CUDA(e);
        greedy_graph = greedy;
      }
      IL_CUDA(cudaGraphLaunch(graph, stream()));
      cuda::count_launch();  // the whole step, one launch from the host
    }
    cache.commit(1);  // the step's kernel wrote the position's keys and values
  }

  void set_device_int(Tensor& t, std::int32_t v) { t.copy_from(Tensor::from_vector(std::vector<std::int32_t>{v}, {1})); }
};

CudaDecoder::CudaDecoder(const models::Llama& m, std::int64_t capacity, bool use_graph)
    : impl_((cuda::require_device(), std::make_unique<Impl>(m, capacity, use_graph))) {}  // no device: say so first
CudaDecoder::~CudaDecoder() = default;

Tensor CudaDecoder::prefill(const std::vector<std::int32_t>& tokens) {
  Tensor out = forward_cached(impl_->m, impl_->cache, tokens);
  impl_->set_device_int(impl_->pos, static_cast<std::int32_t>(impl_->cache.length()));
  return out;
}

Tensor CudaDecoder::step(std::int32_t token) {
  IL_CHECK(token >= 0 && token < impl_->V, "CudaDecoder: token id ", token, " is outside the vocabulary");
  impl_->set_device_int(impl_->pos, static_cast<std::int32_t>(impl_->cache.length()));
  impl_->set_device_int(impl_->token, token);
  impl_->run_step(false);
  return impl_->logits;
}

std::vector<std::int32_t> CudaDecoder::greedy(std::int32_t token, int n) {
  IL_CHECK(token >= 0 && token < impl_->V, "CudaDecoder: token id ", token, " is outside the vocabulary");
  IL_CHECK(n >= 0, "CudaDecoder: cannot generate ", n, " tokens");
  IL_CHECK(impl_->cache.length() + n <= impl_->cache.capacity(), "KV cache full: ", impl_->cache.length(), " + ", n,
           " positions exceed its capacity of ", impl_->cache.capacity());
  const std::int64_t first = impl_->cache.length();
  impl_->set_device_int(impl_->pos, static_cast<std::int32_t>(first));
  impl_->set_device_int(impl_->token, token);
  for (int i = 0; i < n; ++i) impl_->run_step(true);  // the chosen token feeds the next step on the device
  const Tensor log = impl_->log.to(Device::CPU);
  const std::int32_t* p = log.data<std::int32_t>();
  return std::vector<std::int32_t>(p + first, p + first + n);
}

void decode_attention(const Tensor& q, const Tensor& k, const Tensor& v, std::int64_t len, Tensor& out) {
  cuda::decode_attention(cuda::DecodeAttention::PerHead, q, k, v, len, out);
}

std::int64_t CudaDecoder::length() const { return impl_->cache.length(); }
const models::ContiguousKVCache& CudaDecoder::cache() const { return impl_->cache; }

double CudaDecoder::step_bytes() const {
  return static_cast<double>(impl_->m.step_weight_bytes() + impl_->m.config.kv_cache_bytes(impl_->cache.length() + 1, 4));
}

}  // namespace inferlab::ch02
