#pragma once
/// @file linear.h
/// @brief The one weight type of every model: a linear layer y = x·Wᵀ + b.
///
/// W is either a plain tensor (f32, f16, bf16: ops::matmul reads it) or a packed matrix that
/// multiplies itself (chapter 09's quantised formats implement PackedMatrix). linear() picks
/// the one that is set, explicitly; the model code never knows which it has.

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/tensor.h"

namespace inferlab {

/// A weight matrix [N, K] stored in a format that ops::matmul does not read (quantised bytes
/// and their scales). It knows how to multiply itself and how big it is.
class PackedMatrix {
 public:
  virtual ~PackedMatrix() = default;
  /// out [M, N] = x [M, K] · Wᵀ (x f32, on the matrix's device).
  virtual void matmul(const Tensor& x, Tensor& out) const = 0;
  virtual std::int64_t out_features() const = 0;  ///< N
  virtual std::int64_t in_features() const = 0;   ///< K
  /// Bytes a product reads: the packed values and their scales.
  virtual std::int64_t bytes() const = 0;
  virtual Device device() const = 0;
  /// A copy on `device`.
  virtual std::shared_ptr<const PackedMatrix> to_device(Device device) const = 0;
  /// "q8_0", "int4_g128_sym", ...
  virtual std::string format() const = 0;
};

/// A linear layer as torch.nn.Linear stores it: weight [out, in] (or a packed matrix) and an
/// optional bias [out] (kept in f32, since it is added to f32 activations).
struct Linear {
  Tensor weight;                               ///< [N, K] f32/f16/bf16, or undefined when packed
  std::shared_ptr<const PackedMatrix> packed;  ///< set instead of `weight` for packed formats
  Tensor bias;                                 ///< [N] f32, or undefined

  Linear() = default;
  Linear(Tensor w, Tensor b = {}) : weight(std::move(w)), bias(std::move(b)) {}  // NOLINT: a plain weight is a Linear
  Linear(std::shared_ptr<const PackedMatrix> p, Tensor b = {}) : packed(std::move(p)), bias(std::move(b)) {}

  bool defined() const { return packed != nullptr || weight.defined(); }
  std::int64_t out_features() const { return packed ? packed->out_features() : weight.size(0); }
  std::int64_t in_features() const { return packed ? packed->in_features() : weight.size(1); }
  /// Bytes a product reads: the weight (as stored) and the bias.
  std::int64_t bytes() const;
  Device device() const { return packed ? packed->device() : weight.device(); }
  /// A copy on `device`; a plain weight is converted to `dtype` (a packed one keeps its format,
  /// the bias stays f32).
  Linear to(Device device, DType dtype) const;
};

/// out [M, N] = x [M, K] · Wᵀ + b.
void linear(const Tensor& x, const Linear& l, Tensor& out);
Tensor linear(const Tensor& x, const Linear& l);
/// linear(x, *l) for several layers that share their input (q, k and v; gate and up). Plain
/// weights go through ops::matmuls (on the CPU at decode, one pass of the threads over all of
/// their rows); packed ones one linear() each. The results are linear()'s, bit for bit.
std::vector<Tensor> linears(const Tensor& x, const std::vector<const Linear*>& ls);

/// While alive, every linear() on this thread first calls `fn(layer, x)`: a way to watch what a
/// model's layers are fed (chapter 09's AWQ records each layer's calibration inputs this way)
/// without a second copy of the model. Scopes nest; the innermost one is called.
class LinearHook {
 public:
  using Fn = std::function<void(const Linear& layer, const Tensor& x)>;
  explicit LinearHook(Fn fn);
  ~LinearHook();
  LinearHook(const LinearHook&) = delete;
  LinearHook& operator=(const LinearHook&) = delete;

 private:
  friend void linear(const Tensor&, const Linear&, Tensor&);
  friend std::vector<Tensor> linears(const Tensor&, const std::vector<const Linear*>&);
  Fn fn_;
  LinearHook* parent_;
};

}  // namespace inferlab
