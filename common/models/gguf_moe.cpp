#include "common/models/gguf_moe.h"

#include "common/quant/qmatrix_impl.h"

#include <cstring>

namespace inferlab::models {

using namespace quant;

std::optional<MoeConfig> gguf_moe_config(const gguf::File& f, const std::string& arch, std::int64_t layers,
                                         std::int64_t intermediate_size) {
  const std::string k = arch + ".";
  if (!f.has(k + "expert_count")) return std::nullopt;
  MoeConfig m;
  m.names = arch == "qwen2moe" ? MoeNames::Qwen2Moe : MoeNames::Mixtral;
  auto count = [&](const std::string& key) {
    const std::int64_t v = f.get_int(key);
    IL_CHECK(v >= 0 && v < (std::int64_t{1} << 24), f.path(), ": metadata '", key, "' = ", v,
             " is not a plausible count (must be in [0, 2^24))");
    return v;
  };
  m.num_experts = count(k + "expert_count");
  m.top_k = count(k + "expert_used_count");
  // Mixtral's experts are as wide as feed_forward_length; qwen2moe says its own.
  m.expert_size = f.has(k + "expert_feed_forward_length") ? count(k + "expert_feed_forward_length") : intermediate_size;
  if (arch == "qwen2moe") {
    m.shared_size = count(k + "expert_shared_feed_forward_length");
    m.shared_gate = true;
  }
  // llama.cpp's build_moe_ffn: softmax gating, weights renormalised for llama, not for qwen2moe.
  m.norm_topk_prob = arch == "llama";
  for (std::int64_t i = 0; i < layers; ++i)
    if (!f.contains("blk." + std::to_string(i) + ".ffn_gate_inp.weight")) m.dense_layers.push_back(i);
  m.validate(f.path() + " (" + arch + ".expert_* metadata, named as in a config.json)", layers);
  return m;
}

MoeFfn read_gguf_moe(const gguf::File& f, const MoeConfig& c, std::int64_t D, std::int64_t layer,
                     std::set<std::string>& used) {
  const std::string b = "blk." + std::to_string(layer) + ".";
  const std::int64_t E = c.num_experts, Fe = c.expert_size;
  auto is_plain = [](gguf::Type t) { return t == gguf::Type::F32 || t == gguf::Type::F16 || t == gguf::Type::BF16; };
  auto format_of = [&](const std::string& name, gguf::Type t) {
    if (blocks_activations(t)) return t;  // a block type is its format
    fail(f.path(), ": tensor ", name, " is ", gguf::type_name(t),
         "; this loader reads F32, F16, BF16 and chapter 09's block types");
  };
  // Rows [r0, r0 + rows) of a tensor of `cols` columns, as a Linear in its stored type.
  auto rows_of = [&](const std::string& name, std::int64_t r0, std::int64_t rows, std::int64_t cols) {
    const gguf::Type t = f.info(name).type;
    if (is_plain(t)) {
      const Tensor all = f.tensor(name);
      return Linear(
          check_finite(all.view({all.numel() / cols, cols}).slice(0, r0, r0 + rows).clone(), f.path() + ": tensor " + name));
    }
    const Format fmt = format_of(name, t);
    const Tensor blocks = f.raw(name).slice(0, r0, r0 + rows).clone();
    check_block_scales(blocks, fmt, f.path() + ": tensor " + name);
    return Linear(std::make_shared<QMatrix>(QuantSpec{fmt}, rows, cols, blocks));
  };
  auto tensor = [&](const std::string& name, const Shape& s) -> const gguf::TensorInfo& {
    used.insert(name);
    const auto& i = f.info(name);
    IL_CHECK(i.shape == s, f.path(), ": tensor ", name, " has shape ", shape_str(i.shape), ", expected ", shape_str(s));
    return i;
  };
  MoeFfn m;
  m.config = c;
  tensor(b + "ffn_gate_inp.weight", {E, D});
  m.router = rows_of(b + "ffn_gate_inp.weight", 0, E, D);
  tensor(b + "ffn_gate_exps.weight", {E, Fe, D}), tensor(b + "ffn_up_exps.weight", {E, Fe, D});
  tensor(b + "ffn_down_exps.weight", {E, D, Fe});
  for (std::int64_t e = 0; e < E; ++e)  // expert e: rows e·Fe .. of gate and up, e·D .. of down
    m.experts.push_back(Expert{rows_of(b + "ffn_gate_exps.weight", e * Fe, Fe, D),
                               rows_of(b + "ffn_up_exps.weight", e * Fe, Fe, D),
                               rows_of(b + "ffn_down_exps.weight", e * D, D, Fe)});
  if (c.shared_size > 0) {
    const std::int64_t Fs = c.shared_size;
    tensor(b + "ffn_gate_shexp.weight", {Fs, D}), tensor(b + "ffn_up_shexp.weight", {Fs, D});
    tensor(b + "ffn_down_shexp.weight", {D, Fs});
    m.shared = Expert{rows_of(b + "ffn_gate_shexp.weight", 0, Fs, D), rows_of(b + "ffn_up_shexp.weight", 0, Fs, D),
                      rows_of(b + "ffn_down_shexp.weight", 0, D, Fs)};
  }
  if (c.shared_gate) {
    // llama.cpp creates it as [D]; the converter may write Hugging Face's [1, D].
    const std::string n = b + "ffn_gate_inp_shexp.weight";
    used.insert(n);
    const auto& i = f.info(n);
    IL_CHECK(i.shape == Shape({D}) || i.shape == Shape({1, D}), f.path(), ": tensor ", n, " has shape ", shape_str(i.shape),
             ", expected [", D, "]");
    m.shared_gate = rows_of(n, 0, 1, D);
  }
  return m;
}

gguf::Output stack_experts(const std::string& name, const std::vector<gguf::Output>& experts) {
  IL_CHECK(!experts.empty(), "GGUF: ", name, ": no experts to stack");
  const gguf::Output& first = experts[0];
  std::int64_t total = 0;
  for (const gguf::Output& e : experts) {
    IL_CHECK(e.type == first.type && e.shape == first.shape, "GGUF: ", name, ": the experts differ in type or shape (",
             gguf::type_name(e.type), shape_str(e.shape), " against ", gguf::type_name(first.type), shape_str(first.shape),
             "); llama.cpp stacks them into one tensor");
    total += static_cast<std::int64_t>(e.bytes.nbytes());
  }
  Tensor bytes = Tensor::empty({total}, DType::U8);
  std::int64_t at = 0;
  for (const gguf::Output& e : experts) {
    const Tensor b = e.bytes.contiguous();
    std::memcpy(bytes.data<std::uint8_t>() + at, b.raw_data(), b.nbytes());
    at += static_cast<std::int64_t>(b.nbytes());
  }
  Shape shape{static_cast<std::int64_t>(experts.size())};
  shape.insert(shape.end(), first.shape.begin(), first.shape.end());
  return {name, first.type, shape, bytes};
}

std::string gguf_moe_architecture(const MoeConfig& c, bool qkv_bias) {
  // llama.cpp's build_moe_ffn: llama (Mixtral) renormalises the k softmax weights and has no
  // shared expert; qwen2moe does not renormalise and gates one shared expert.
  const bool mixtral = c.shared_size == 0 && !c.shared_gate && c.norm_topk_prob && !qkv_bias;
  const bool qwen2moe = c.shared_size > 0 && c.shared_gate && !c.norm_topk_prob && qkv_bias;
  IL_CHECK(c.scoring == MoeScoring::Softmax && c.grouping == MoeGrouping::None && !c.score_bias &&
               c.routed_scaling_factor == 1 && (mixtral || qwen2moe),
           "GGUF: this MoE model is neither Mixtral-like (llama: softmax top-k renormalised, no shared expert, no "
           "biases) nor Qwen2-MoE-like (qwen2moe: softmax top-k not renormalised, a gated shared expert, q/k/v "
           "biases), the two MoE architectures this writer records");
  return mixtral ? "llama" : "qwen2moe";
}

std::vector<std::pair<std::string, gguf::Value>> gguf_moe_metadata(const MoeConfig& c, const std::string& arch) {
  auto u32 = [](std::int64_t v) { return gguf::Value::u32(static_cast<std::uint32_t>(v)); };
  std::vector<std::pair<std::string, gguf::Value>> meta = {{arch + ".expert_count", u32(c.num_experts)},
                                                           {arch + ".expert_used_count", u32(c.top_k)}};
  if (arch == "qwen2moe") {
    meta.emplace_back(arch + ".expert_feed_forward_length", u32(c.expert_size));
    meta.emplace_back(arch + ".expert_shared_feed_forward_length", u32(c.shared_size));
  }
  return meta;
}

}  // namespace inferlab::models
