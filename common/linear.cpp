#include "common/linear.h"

#include "common/ops.h"

namespace inferlab {

namespace {
thread_local LinearHook* active_hook = nullptr;
}

LinearHook::LinearHook(Fn fn) : fn_(std::move(fn)), parent_(active_hook) { active_hook = this; }
LinearHook::~LinearHook() { active_hook = parent_; }

std::int64_t Linear::bytes() const {
  const std::int64_t w = packed ? packed->bytes() : static_cast<std::int64_t>(weight.nbytes());
  return w + static_cast<std::int64_t>(bias.defined() ? bias.nbytes() : 0);
}

Linear Linear::to(Device device, DType dtype) const {
  Linear l;
  if (packed) l.packed = packed->to_device(device);
  else if (weight.defined()) l.weight = weight.to(dtype).to(device);
  if (bias.defined()) l.bias = bias.to(DType::F32).to(device);
  return l;
}

void linear(const Tensor& x, const Linear& l, Tensor& out) {
  IL_CHECK(l.defined(), "linear: the layer has no weight");
  if (active_hook) active_hook->fn_(l, x);
  if (l.packed) l.packed->matmul(x, out);
  else ops::matmul(x, l.weight, out);
  if (l.bias.defined()) ops::add(out, l.bias, out);
}

Tensor linear(const Tensor& x, const Linear& l) {
  IL_CHECK(l.defined(), "linear: the layer has no weight");
  IL_CHECK(x.ndim() == 2, "linear: x must be [M, K], got ", x.describe());
  Tensor out = Tensor::empty({x.size(0), l.out_features()}, DType::F32, x.device());
  linear(x, l, out);
  return out;
}

std::vector<Tensor> linears(const Tensor& x, const std::vector<const Linear*>& ls) {
  IL_CHECK(x.ndim() == 2, "linears: x must be [M, K], got ", x.describe());
  std::vector<Tensor> outs;
  bool plain = true;
  for (const Linear* l : ls) {
    IL_CHECK(l->defined(), "linears: a layer has no weight");
    outs.push_back(Tensor::empty({x.size(0), l->out_features()}, DType::F32, x.device()));
    plain = plain && !l->packed;
  }
  if (!plain) {
    for (std::size_t j = 0; j < ls.size(); ++j) linear(x, *ls[j], outs[j]);
    return outs;
  }
  std::vector<const Tensor*> ws;
  std::vector<Tensor*> ys;
  for (std::size_t j = 0; j < ls.size(); ++j) {
    if (active_hook) active_hook->fn_(*ls[j], x);
    ws.push_back(&ls[j]->weight), ys.push_back(&outs[j]);
  }
  ops::matmuls(x, ws, ys);
  for (std::size_t j = 0; j < ls.size(); ++j)
    if (ls[j]->bias.defined()) ops::add(outs[j], ls[j]->bias, outs[j]);
  return outs;
}

}  // namespace inferlab
