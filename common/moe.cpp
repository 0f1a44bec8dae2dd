#include "common/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "common/hf_config.h"
#include "common/json_file.h"
#include "common/ops.h"

namespace inferlab {

// ---------------------------------------------------------------------------------------------
// The config.
bool moe_llama_family(const std::string& arch) { return arch == "MixtralForCausalLM" || arch == "Qwen2MoeForCausalLM"; }

bool MoeConfig::is_moe_layer(std::int64_t layer) const {
  return layer >= first_dense && (layer + 1) % sparse_step == 0 &&
         std::find(dense_layers.begin(), dense_layers.end(), layer) == dense_layers.end();
}

std::int64_t MoeConfig::layer_parameters(std::int64_t D) const {
  // E · 3 · D · Fe overflows for counts each in range (4096 experts of 2^20 × 2^20): checked.
  const char* what = "MoE layer parameters";
  const std::int64_t experts = checked_mul(checked_mul(num_experts, 3 * D, what), expert_size, what);
  return checked_add(checked_add(router_parameters(D), experts, what), checked_mul(3 * D, shared_size, what), what);
}

std::int64_t MoeConfig::active_parameters(std::int64_t D) const {
  return router_parameters(D) + top_k * 3 * D * expert_size + 3 * D * shared_size;
}

std::int64_t MoeConfig::router_parameters(std::int64_t D) const {
  return num_experts * D + (shared_gate ? D : 0) + (score_bias ? num_experts : 0);
}

void MoeConfig::validate(const std::string& where, std::int64_t num_layers) const {
  struct Field {
    const char* name;
    std::int64_t value, lo, hi;
  };
  // Each count under the name the family's config.json gives it.
  const bool mixtral = names == MoeNames::Mixtral, qwen = names == MoeNames::Qwen2Moe;
  const char* experts = mixtral ? "num_local_experts" : qwen ? "num_experts" : "n_routed_experts";
  const char* width = mixtral ? "intermediate_size" : "moe_intermediate_size";
  const char* shared = qwen ? "shared_expert_intermediate_size" : "n_shared_experts";
  const std::int64_t shared_value = names == MoeNames::DeepSeek && expert_size > 0 ? shared_size / expert_size : shared_size;
  for (const Field& f : {Field{experts, num_experts, 1, 1 << 12}, Field{"num_experts_per_tok", top_k, 1, num_experts},
                         Field{width, expert_size, 1, 1 << 20}, Field{shared, shared_value, 0, 1 << 20},
                         Field{"n_group", n_group, 1, num_experts}, Field{"topk_group", topk_group, 1, n_group},
                         Field{"first_k_dense_replace", first_dense, 0, num_layers},
                         Field{"decoder_sparse_step", sparse_step, 1, num_layers}})
    IL_CHECK(f.value >= f.lo && f.value <= f.hi, where, ": field '", f.name, "' must be in [", f.lo, ", ", f.hi, "], got ",
             f.value);
  IL_CHECK(num_experts % n_group == 0, where, ": n_group ", n_group, " does not divide the ", num_experts,
           " routed experts into equal groups");
  if (grouping == MoeGrouping::GroupTop2Sum)  // a group's score is its two best experts' sum
    IL_CHECK(num_experts / n_group >= 2, where, ": n_group ", n_group, " leaves fewer than 2 experts a group (", num_experts,
             " experts); DeepSeek-V3's group score sums each group's top 2");
  if (grouping != MoeGrouping::None)  // the groups kept must hold at least k experts
    IL_CHECK(topk_group * (num_experts / n_group) >= top_k, where, ": topk_group ", topk_group, " groups of ",
             num_experts / n_group, " experts hold fewer than num_experts_per_tok ", top_k);
  // The expert weights are float32: a factor past float32's range would turn every one into inf.
  IL_CHECK(std::isfinite(routed_scaling_factor) && routed_scaling_factor > 0 &&
               routed_scaling_factor <= std::numeric_limits<float>::max(),
           where, ": field 'routed_scaling_factor' must be a positive float32, got ", routed_scaling_factor);
  for (std::int64_t l : dense_layers)
    IL_CHECK(l >= 0 && l < num_layers, where, ": field 'mlp_only_layers' lists layer ", l, ", outside [0, ", num_layers,
             ")");
}

std::optional<MoeConfig> parse_moe_config(const HfConfig& hf, const TransformerConfig& c) {
  const JsonFields f(hf.json, hf.path);
  const std::string& arch = c.architecture;
  const std::string type = hf.model_type();
  MoeConfig m;
  // A list field: integers, each named when it is not one.
  auto int_list = [&](const char* key) {
    std::vector<std::int64_t> out;
    if (!f.has(key)) return out;
    IL_CHECK(hf.json[key].is_array(), hf.path, ": field '", key, "' must be a list of layer indices, got ",
             hf.json[key].dump());
    for (const auto& v : hf.json[key]) {
      IL_CHECK(v.is_number_integer(), hf.path, ": field '", key, "' must hold integers, got ", v.dump());
      out.push_back(v.get<std::int64_t>());
    }
    return out;
  };
  if (arch == "MixtralForCausalLM" || (arch.empty() && type == "mixtral")) {
    // MixtralSparseMoeBlock: softmax over the experts, top k, always renormalised; every layer.
    m.names = MoeNames::Mixtral;
    m.num_experts = f.get_or<std::int64_t>("num_local_experts", 8);
    m.top_k = f.get_or<std::int64_t>("num_experts_per_tok", 2);
    m.expert_size = c.intermediate_size;
    m.norm_topk_prob = true;
  } else if (arch == "Qwen2MoeForCausalLM" || (arch.empty() && type == "qwen2_moe")) {
    // Qwen2MoeSparseMoeBlock: softmax, top k, renormalised by norm_topk_prob; one shared expert
    // with a sigmoid gate; MoE where (i + 1) % decoder_sparse_step == 0 and i not in mlp_only_layers.
    m.names = MoeNames::Qwen2Moe;
    m.num_experts = f.get_or<std::int64_t>("num_experts", 60);
    if (m.num_experts == 0) return std::nullopt;  // transformers builds dense MLPs everywhere then
    m.top_k = f.get_or<std::int64_t>("num_experts_per_tok", 4);
    m.expert_size = f.get_or<std::int64_t>("moe_intermediate_size", 1408);
    m.shared_size = f.get_or<std::int64_t>("shared_expert_intermediate_size", 5632);
    IL_CHECK(m.shared_size > 0, hf.path,
             ": field 'shared_expert_intermediate_size' must be positive: Qwen2-MoE always has a shared expert");
    m.shared_gate = true;
    m.norm_topk_prob = f.get_or<bool>("norm_topk_prob", false);
    m.sparse_step = f.get_or<std::int64_t>("decoder_sparse_step", 1);
    m.dense_layers = int_list("mlp_only_layers");
  } else if (arch == "DeepseekV2ForCausalLM" || arch == "DeepseekV3ForCausalLM") {
    const bool v3 = arch == "DeepseekV3ForCausalLM";
    // transformers builds an MoE block in every layer from first_k_dense_replace on (class
    // defaults 0 for V2, 3 for V3), whatever n_routed_experts says.
    m.first_dense = f.get_or<std::int64_t>("first_k_dense_replace", v3 ? 3 : 0);
    IL_CHECK(m.first_dense >= 0, hf.path, ": field 'first_k_dense_replace' must be non-negative, got ", m.first_dense);
    // Given past the layers, the file and the checkpoint disagree (its MoE tensors would be read
    // as dense ones); left out, V3's class default of 3 on a smaller model means every layer dense.
    IL_CHECK(!f.has("first_k_dense_replace") || m.first_dense <= c.num_layers, hf.path,
             ": field 'first_k_dense_replace' = ", m.first_dense, " exceeds num_hidden_layers (", c.num_layers, ")");
    if (m.first_dense >= c.num_layers) return std::nullopt;  // every layer dense
    // DeepSeek's own code puts MoE only in every moe_layer_freq-th layer; transformers ignores it.
    IL_CHECK(f.get_or<std::int64_t>("moe_layer_freq", 1) == 1, hf.path, ": field 'moe_layer_freq' is ",
             hf.json["moe_layer_freq"].dump(), "; transformers' ", arch,
             " puts an MoE block in every layer from first_k_dense_replace on, so only 1 is run");
    m.names = MoeNames::DeepSeek;
    for (const char* key : {"n_routed_experts", "num_experts_per_tok", "n_shared_experts"})
      IL_CHECK(!(hf.json.contains(key) && hf.json[key].is_null()), hf.path, ": field '", key, "' is null but layers ",
               m.first_dense, " on (first_k_dense_replace) are MoE layers");
    m.num_experts = f.get_or<std::int64_t>("n_routed_experts", v3 ? 256 : 64);
    m.top_k = v3 ? f.get_or<std::int64_t>("num_experts_per_tok", 8) : f.get<std::int64_t>("num_experts_per_tok");
    m.expert_size = f.get_or<std::int64_t>("moe_intermediate_size", v3 ? 2048 : 1407);
    const std::int64_t shared = f.get_or<std::int64_t>("n_shared_experts", v3 ? 1 : 2);
    IL_CHECK(shared >= 0 && shared <= 64, hf.path, ": field 'n_shared_experts' must be in [0, 64], got ", shared);
    m.shared_size = shared * m.expert_size;
    m.routed_scaling_factor = f.get_or<double>("routed_scaling_factor", v3 ? 2.5 : 1.0);
    const std::string scoring = f.get_or<std::string>("scoring_func", v3 ? "sigmoid" : "softmax");
    IL_CHECK(scoring == (v3 ? "sigmoid" : "softmax"), hf.path, ": field 'scoring_func' is '", scoring, "'; transformers' ",
             arch, " always scores with ", v3 ? "sigmoid" : "softmax", ", so only that is run");
    if (v3) {
      // DeepseekV3TopkRouter: sigmoid scores, e_score_correction_bias added for the choice only,
      // groups ranked by their top-2 sum ("noaux_tc").
      m.scoring = MoeScoring::Sigmoid;
      m.score_bias = true;
      m.grouping = MoeGrouping::GroupTop2Sum;
      const std::string method = f.get_or<std::string>("topk_method", "noaux_tc");
      IL_CHECK(method == "noaux_tc", hf.path, ": field 'topk_method' is '", method,
               "'; transformers' DeepseekV3ForCausalLM always routes by 'noaux_tc', so only that is run");
      m.n_group = f.get_or<std::int64_t>("n_group", 8);
      m.topk_group = f.get_or<std::int64_t>("topk_group", 4);
      m.norm_topk_prob = f.get_or<bool>("norm_topk_prob", true);
    } else {
      // DeepseekV2MoEGate: softmax scores, topk_method greedy or group_limited_greedy (groups by
      // their best score), weights times routed_scaling_factor and never renormalised.
      const std::string method = f.get_or<std::string>("topk_method", "greedy");
      IL_CHECK(method == "greedy" || method == "group_limited_greedy", hf.path, ": field 'topk_method' is '", method,
               "'; DeepseekV2 routes by 'greedy' or 'group_limited_greedy'");
      if (method == "group_limited_greedy") {
        m.grouping = MoeGrouping::GroupMax;
        m.n_group = f.get<std::int64_t>("n_group");
        m.topk_group = f.get<std::int64_t>("topk_group");
      }
      IL_CHECK(!f.get_or<bool>("norm_topk_prob", false), hf.path,
               ": field 'norm_topk_prob' is true; transformers' DeepseekV2ForCausalLM ignores it (its weights "
               "are the softmax scores times routed_scaling_factor) while DeepSeek's own code renormalises, so "
               "the chapter does not pick one");
    }
  } else {
    return std::nullopt;
  }
  m.validate(hf.path, c.num_layers);
  return m;
}

// ---------------------------------------------------------------------------------------------
// Routing.
void route_row(const MoeConfig& c, const float* logits, const float* score_bias, std::int32_t* expert, float* weight) {
  const std::int64_t E = c.num_experts, k = c.top_k;
  std::vector<double> s(static_cast<std::size_t>(E));
  if (c.scoring == MoeScoring::Softmax) {
    const double mx = *std::max_element(logits, logits + E);
    double sum = 0;
    for (std::int64_t j = 0; j < E; ++j) sum += s[j] = std::exp(logits[j] - mx);
    for (double& v : s) v /= sum;
  } else {
    for (std::int64_t j = 0; j < E; ++j) s[j] = 1 / (1 + std::exp(-static_cast<double>(logits[j])));
  }
  // The scores experts are chosen by: V3 adds its bias, for the choice only.
  std::vector<double> choice = s;
  if (score_bias != nullptr)
    for (std::int64_t j = 0; j < E; ++j) choice[j] += score_bias[j];
  // Best first; among equals the lower index (a tie between random floats does not happen).
  auto top = [](const std::vector<double>& v, std::int64_t n) {
    std::vector<std::int32_t> idx(v.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + n, idx.end(),
                      [&](std::int32_t a, std::int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
    idx.resize(static_cast<std::size_t>(n));
    return idx;
  };
  if (c.grouping != MoeGrouping::None) {
    const std::int64_t G = c.n_group, per = E / G;
    std::vector<double> group(static_cast<std::size_t>(G));
    for (std::int64_t g = 0; g < G; ++g) {
      const std::vector<double> members(choice.begin() + g * per, choice.begin() + (g + 1) * per);
      const auto best = top(members, c.grouping == MoeGrouping::GroupMax ? 1 : 2);
      group[g] = 0;
      for (std::int32_t b : best) group[g] += members[b];
    }
    std::vector<bool> kept(static_cast<std::size_t>(G), false);
    for (std::int32_t g : top(group, c.topk_group)) kept[g] = true;
    // transformers masks the other groups' scores to 0.0 (not -inf): with V3's bias a kept
    // expert's biased score can be below 0 and lose to a masked one. Done the same here.
    for (std::int64_t j = 0; j < E; ++j)
      if (!kept[j / per]) choice[j] = 0.0;
  }
  const auto chosen = top(choice, k);
  double sum = 0;
  for (std::int32_t e : chosen) sum += s[e];
  // DeepseekV3 adds 1e-20 to the sum (sigmoid scores can all be tiny); softmax ones cannot.
  const double norm = c.norm_topk_prob ? sum + (c.scoring == MoeScoring::Sigmoid ? 1e-20 : 0.0) : 1.0;
  for (std::int64_t j = 0; j < k; ++j) {
    expert[j] = chosen[j];
    weight[j] = static_cast<float>(s[chosen[j]] / norm * c.routed_scaling_factor);
  }
}

namespace {

thread_local MoeRoutingHook* current_hook = nullptr;

void check_input(const MoeFfn& f, const Tensor& h) {
  IL_CHECK(f.defined(), "moe_block: the layer has no router (a dense layer)");
  IL_CHECK(h.device() == Device::CPU, "moe_block: mixture-of-experts layers run on the CPU only (--device cpu); got ",
           h.describe());
  IL_CHECK(h.ndim() == 2 && h.dtype() == DType::F32 && h.size(1) == f.router.in_features(), "moe_block: h must be f32 [T, ",
           f.router.in_features(), "], got ", h.describe());
}

Tensor swiglu_ffn(const Expert& e, const Tensor& x) {
  return linear(ops::swiglu(linear(x, e.gate), linear(x, e.up)), e.down);
}

// The shared experts' output [T, D] (times Qwen2-MoE's sigmoid gate), or undefined.
Tensor shared_output(const MoeFfn& f, const Tensor& h) {
  if (!f.shared.defined()) return {};
  Tensor s = swiglu_ffn(f.shared, h);
  if (f.shared_gate.defined()) {
    const Tensor g = linear(h, f.shared_gate);  // [T, 1]
    const std::int64_t D = s.size(1);
    for (std::int64_t t = 0; t < s.size(0); ++t) {
      const float sg = static_cast<float>(1 / (1 + std::exp(-static_cast<double>(g.data<float>()[t]))));
      for (std::int64_t d = 0; d < D; ++d) s.data<float>()[t * D + d] *= sg;
    }
  }
  return s;
}

// out[t] = Σ_j w[t, j] · y[t, j] (j in choice order) + shared[t]: the one sum both paths end with.
Tensor combine(const MoeRouting& r, const std::vector<float>& y, const Tensor& shared, std::int64_t D) {
  const std::int64_t T = r.rows(), k = r.k;
  Tensor out = Tensor::zeros({T, D}, DType::F32);
  float* o = out.data<float>();
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t j = 0; j < k; ++j) {
      const float w = r.weight[t * k + j];
      const float* yj = y.data() + (t * k + j) * D;
      for (std::int64_t d = 0; d < D; ++d) o[t * D + d] += w * yj[d];
    }
  if (shared.defined()) ops::add(out, shared, out);
  return out;
}

}  // namespace

MoeRoutingHook::MoeRoutingHook(Fn fn) : fn_(std::move(fn)), parent_(current_hook) { current_hook = this; }
MoeRoutingHook::~MoeRoutingHook() { current_hook = parent_; }

MoeRouting route(const MoeFfn& f, const Tensor& h) {
  check_input(f, h);
  const MoeConfig& c = f.config;
  const std::int64_t T = h.size(0), E = c.num_experts, k = c.top_k;
  const Tensor logits = linear(h, f.router);  // [T, E]
  MoeRouting r;
  r.k = k;
  r.expert.resize(static_cast<std::size_t>(T * k));
  r.weight.resize(static_cast<std::size_t>(T * k));
  const float* bias = f.score_bias.defined() ? f.score_bias.data<float>() : nullptr;
  for (std::int64_t t = 0; t < T; ++t)
    route_row(c, logits.data<float>() + t * E, bias, r.expert.data() + t * k, r.weight.data() + t * k);
  for (MoeRoutingHook* hk = current_hook; hk != nullptr; hk = hk->parent_) hk->fn_(f, r);
  return r;
}

Tensor moe_block(const MoeFfn& f, const Tensor& h_in) {
  const Tensor h = h_in.contiguous();
  const MoeRouting r = route(f, h);
  const std::int64_t T = h.size(0), D = h.size(1), k = r.k;
  // The rows each expert was chosen by, as slots t·k + j of the routing.
  std::vector<std::vector<std::int64_t>> slots(f.experts.size());
  for (std::int64_t s = 0; s < T * k; ++s) slots[static_cast<std::size_t>(r.expert[s])].push_back(s);
  std::vector<float> y(static_cast<std::size_t>(T * k * D));
  for (std::size_t e = 0; e < slots.size(); ++e) {
    if (slots[e].empty()) continue;  // an expert no row chose: its weights are not read
    const std::int64_t n = static_cast<std::int64_t>(slots[e].size());
    Tensor x = Tensor::empty({n, D}, DType::F32);
    for (std::int64_t i = 0; i < n; ++i)
      std::memcpy(x.data<float>() + i * D, h.data<float>() + slots[e][i] / k * D, sizeof(float) * D);
    const Tensor out = swiglu_ffn(f.experts[e], x);  // one pass over the expert's weights for all n rows
    for (std::int64_t i = 0; i < n; ++i)
      std::memcpy(y.data() + slots[e][i] * D, out.data<float>() + i * D, sizeof(float) * D);
  }
  return combine(r, y, shared_output(f, h), D);
}

namespace ref {
Tensor moe_block(const MoeFfn& f, const Tensor& h_in) {
  const Tensor h = h_in.contiguous();
  check_input(f, h);
  const std::int64_t T = h.size(0), D = h.size(1), k = f.config.top_k;
  MoeRouting r;
  r.k = k;
  r.expert.resize(static_cast<std::size_t>(T * k));
  r.weight.resize(static_cast<std::size_t>(T * k));
  std::vector<float> y(static_cast<std::size_t>(T * k * D));
  const float* bias = f.score_bias.defined() ? f.score_bias.data<float>() : nullptr;
  for (std::int64_t t = 0; t < T; ++t) {
    const Tensor row = h.slice(0, t, t + 1);
    const Tensor logits = linear(row, f.router);  // [1, E]
    route_row(f.config, logits.data<float>(), bias, r.expert.data() + t * k, r.weight.data() + t * k);
    for (std::int64_t j = 0; j < k; ++j) {  // the token's k experts, one after another
      const Tensor out = swiglu_ffn(f.experts[static_cast<std::size_t>(r.expert[t * k + j])], row);
      std::memcpy(y.data() + (t * k + j) * D, out.data<float>(), sizeof(float) * D);
    }
  }
  return combine(r, y, shared_output(f, h), D);
}
}  // namespace ref

double expected_experts_touched(std::int64_t E, std::int64_t k, std::int64_t B) {
  return static_cast<double>(E) *
         (1 - std::pow(1 - static_cast<double>(k) / static_cast<double>(E), static_cast<double>(B)));
}

std::vector<Linear*> MoeFfn::linears() {
  std::vector<Linear*> v{&router};
  for (Expert& e : experts) v.insert(v.end(), {&e.gate, &e.up, &e.down});
  if (shared.defined()) v.insert(v.end(), {&shared.gate, &shared.up, &shared.down});
  if (shared_gate.defined()) v.push_back(&shared_gate);
  return v;
}

std::vector<const Linear*> MoeFfn::linears() const {
  std::vector<const Linear*> v;
  for (Linear* l : const_cast<MoeFfn*>(this)->linears()) v.push_back(l);
  return v;
}

}  // namespace inferlab
