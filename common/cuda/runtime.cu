// Device discovery, memory, the shared stream and cuBLAS handle, and the two ceilings we
// measure (read bandwidth, bf16 GEMM FLOP/s).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>

#include "common/caching_allocator.h"
#include "common/cuda/backend.h"
#include "common/cuda/util.cuh"

namespace inferlab::cuda {

void cuda_failed(cudaError_t e, const char* what, const char* file, int line) {
  fail("CUDA error: ", cudaGetErrorString(e), " (", cudaGetErrorName(e), ") in ", what, " at ", file, ":", line);
}

void cublas_failed(cublasStatus_t s, const char* what, const char* file, int line) {
  fail("cuBLAS error: ", cublasGetStatusString(s), " in ", what, " at ", file, ":", line);
}

namespace {
std::atomic<std::int64_t> g_kernels{0}, g_copies{0};
}  // namespace

void count_launch() { g_kernels.fetch_add(1, std::memory_order_relaxed); }

Launches launches() { return {g_kernels.load(std::memory_order_relaxed), g_copies.load(std::memory_order_relaxed)}; }

bool built() { return true; }

std::string unavailable_reason() {
  static const std::string reason = [] {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the sticky error so later calls are not confused by it
      // The runtime's words for a machine without a GPU ("CUDA driver version is insufficient
      // for CUDA runtime version") read like a version problem; say what it means first.
      const std::string detail = std::string(" (CUDA: ") + cudaGetErrorString(e) + ", " + cudaGetErrorName(e) + ")";
      int driver = 0, runtime = 0;
      cudaDriverGetVersion(&driver);
      cudaRuntimeGetVersion(&runtime);
      auto version = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
      if (e == cudaErrorNoDevice) return "this machine has no NVIDIA GPU" + detail;
      if (e == cudaErrorInsufficientDriver && driver == 0)
        return "this machine has no NVIDIA GPU driver, so no GPU it could use" + detail;
      if (e == cudaErrorInsufficientDriver)
        return "the NVIDIA driver supports CUDA " + version(driver) + ", older than the CUDA " + version(runtime) +
               " this build needs; update the driver" + detail;
      return "the CUDA runtime cannot reach a GPU" + detail;
    }
    if (n == 0) return std::string("this machine has no NVIDIA GPU (the CUDA driver reports no devices)");
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return std::string("cannot read the properties of device 0");
    if (p.major < 8)
      return std::string("device 0 (") + p.name + ") has compute capability " + std::to_string(p.major) + "." +
             std::to_string(p.minor) + "; this build needs 8.0 or newer (it targets sm_80 and sm_90)";
    return std::string();
  }();
  return reason;
}

void require_device() {
  const std::string r = unavailable_reason();
  IL_CHECK(r.empty(), "no CUDA device available: ", r);
}

std::string device_description() {
  require_device();
  cudaDeviceProp p{};
  IL_CUDA(cudaGetDeviceProperties(&p, 0));
  char tail[96];
  std::snprintf(tail, sizeof tail, " (sm_%d%d, %d SMs, %.0f GiB)", p.major, p.minor, p.multiProcessorCount,
                static_cast<double>(p.totalGlobalMem) / (1u << 30));
  return std::string(p.name) + tail;
}

std::size_t device_memory_bytes() {
  require_device();
  cudaDeviceProp p{};
  IL_CUDA(cudaGetDeviceProperties(&p, 0));
  return p.totalGlobalMem;
}

cudaStream_t stream() {
  static cudaStream_t s = [] {
    require_device();
    cudaStream_t st;
    IL_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    return st;
  }();
  return s;
}

cublasHandle_t cublas() {
  static cublasHandle_t h = [] {
    cublasHandle_t handle;
    IL_CUBLAS(cublasCreate(&handle));
    IL_CUBLAS(cublasSetStream(handle, stream()));
    // Plain FP32 math for f32 GEMMs (no silent TF32), tensor cores for 16-bit inputs.
    IL_CUBLAS(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
    return handle;
  }();
  return h;
}

void* scratch(std::size_t bytes) {
  static void* buf = nullptr;
  static std::size_t cap = 0;
  if (bytes > cap) {
    if (buf) {
      IL_CUDA(cudaStreamSynchronize(stream()));
      IL_CUDA(cudaFree(buf));
    }
    cap = std::max(bytes, cap * 2);
    IL_CUDA(cudaMalloc(&buf, cap));
  }
  return buf;
}

namespace {

void* raw_malloc(std::size_t bytes) {
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    std::size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    fail("out of CUDA memory: asked for ", bytes, " bytes with ", free_b, " of ", total_b, " free");
  }
  IL_CUDA(e);
  return p;
}

// Every tensor's device memory goes through one caching allocator (common/caching_allocator.h):
// after a forward pass's first step, its allocations are cache hits. Never destroyed, so no
// cudaFree runs after the CUDA runtime has shut down at exit.
CachingAllocator& allocator() {
  static CachingAllocator* a = new CachingAllocator(raw_malloc, [](void* p) { cudaFree(p); });
  return *a;
}

}  // namespace

void* device_malloc(std::size_t bytes) {
  require_device();
  return allocator().allocate(bytes);
}

void device_free(void* p) {
  allocator().release(p);  // keeps the block for reuse: no cudaFree, no device synchronisation
}

void memcpy(void* dst, const void* src, std::size_t bytes) {
  // Unified addressing tells the driver the direction.
  IL_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream()));
  g_copies.fetch_add(1, std::memory_order_relaxed);
  IL_CUDA(cudaStreamSynchronize(stream()));
}

void memset_zero(void* p, std::size_t bytes) { IL_CUDA(cudaMemsetAsync(p, 0, bytes, stream())); }

void synchronize() { IL_CUDA(cudaStreamSynchronize(stream())); }

// ---------------------------------------------------------------------------------------------
// Ceilings.
namespace {

__global__ void fill_random_bf16(__nv_bfloat16* p, long long n, unsigned seed) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    unsigned h = static_cast<unsigned>(i) * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    p[i] = __float2bfloat16((h & 0xffff) / 65536.0f - 0.5f);
  }
}

__global__ void read_kernel(const float4* __restrict__ p, long long n4, float* __restrict__ sink) {
  float acc = 0.0f;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x) {
    float4 v = p[i];
    acc += v.x + v.y + v.z + v.w;
  }
  if (acc == 12345.678f) sink[0] = acc;  // keeps the loads alive; practically never taken
}

struct Events {
  cudaEvent_t a, b;
  Events() {
    IL_CUDA(cudaEventCreate(&a));
    IL_CUDA(cudaEventCreate(&b));
  }
  ~Events() { cudaEventDestroy(a), cudaEventDestroy(b); }
  float ms() {
    float t;
    IL_CUDA(cudaEventSynchronize(b));
    IL_CUDA(cudaEventElapsedTime(&t, a, b));
    return t;
  }
};

template <class T>
__global__ void fill_uniform_kernel(T* p, long long n, unsigned long long seed, float lo, float hi) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    unsigned long long h = (static_cast<unsigned long long>(i) + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    h ^= h >> 31, h *= 0xBF58476D1CE4E5B9ull, h ^= h >> 29;
    const float r = lo + (hi - lo) * static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
    if constexpr (std::is_same_v<T, float>) p[i] = r;
    else if constexpr (std::is_same_v<T, __half>) p[i] = __float2half_rn(r);
    else p[i] = __float2bfloat16_rn(r);
  }
}

}  // namespace

void fill_uniform(Tensor& t, std::uint64_t seed, float lo, float hi) {
  IL_CHECK(t.is_cuda() && t.is_contiguous(), "fill_uniform: ", t.describe(), " must be a contiguous CUDA tensor");
  const long long n = t.numel();
  if (n == 0) return;
  switch (t.dtype()) {
    case DType::F32:
      fill_uniform_kernel<<<1024, 256, 0, stream()>>>(static_cast<float*>(t.raw_data()), n, seed, lo, hi);
      break;
    case DType::F16:
      fill_uniform_kernel<<<1024, 256, 0, stream()>>>(static_cast<__half*>(t.raw_data()), n, seed, lo, hi);
      break;
    case DType::BF16:
      fill_uniform_kernel<<<1024, 256, 0, stream()>>>(static_cast<__nv_bfloat16*>(t.raw_data()), n, seed, lo, hi);
      break;
    default: fail("fill_uniform: ", t.describe(), " is not a float tensor");
  }
  IL_CUDA_LAUNCHED();
}

double measure_read_bandwidth(std::size_t bytes) {
  require_device();
  float* buf = static_cast<float*>(device_malloc(bytes));
  float* sink = static_cast<float*>(device_malloc(sizeof(float)));
  IL_CUDA(cudaMemsetAsync(buf, 1, bytes, stream()));  // not zeros (0x01010101 bit patterns)
  cudaDeviceProp p{};
  IL_CUDA(cudaGetDeviceProperties(&p, 0));
  const long long n4 = static_cast<long long>(bytes / sizeof(float4));
  const unsigned blocks = static_cast<unsigned>(p.multiProcessorCount) * 8;
  Events ev;
  float best = 1e30f;
  for (int r = 0; r < 23; ++r) {
    IL_CUDA(cudaEventRecord(ev.a, stream()));
    read_kernel<<<blocks, 512, 0, stream()>>>(reinterpret_cast<const float4*>(buf), n4, sink);
    IL_CUDA_LAUNCHED();
    IL_CUDA(cudaEventRecord(ev.b, stream()));
    float ms = ev.ms();
    if (r >= 3) best = std::min(best, ms);  // 3 warm-ups
  }
  device_free(buf);
  device_free(sink);
  return static_cast<double>(n4) * sizeof(float4) / (best * 1e-3);
}

double measure_gemm_flops(int n) {
  require_device();
  const long long nn = static_cast<long long>(n) * n;
  auto* a = static_cast<__nv_bfloat16*>(device_malloc(nn * 2));
  auto* b = static_cast<__nv_bfloat16*>(device_malloc(nn * 2));
  auto* c = static_cast<float*>(device_malloc(nn * 4));
  fill_random_bf16<<<1024, 256, 0, stream()>>>(a, nn, 1u);
  fill_random_bf16<<<1024, 256, 0, stream()>>>(b, nn, 2u);
  IL_CUDA_LAUNCHED();
  const float alpha = 1.0f, beta = 0.0f;
  Events ev;
  float best = 1e30f;
  for (int r = 0; r < 13; ++r) {
    IL_CUDA(cudaEventRecord(ev.a, stream()));
    IL_CUBLAS(cublasGemmEx(cublas(), CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16BF, n, b, CUDA_R_16BF, n, &beta,
                           c, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    IL_CUDA(cudaEventRecord(ev.b, stream()));
    float ms = ev.ms();
    if (r >= 3) best = std::min(best, ms);
  }
  device_free(a), device_free(b), device_free(c);
  return 2.0 * static_cast<double>(nn) * n / (best * 1e-3);
}

}  // namespace inferlab::cuda
