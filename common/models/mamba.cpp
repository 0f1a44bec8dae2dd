#include "common/models/mamba.h"

#include <cmath>
#include <limits>
#include <random>
#include <sstream>

#include "common/error.h"
#include "common/json_file.h"
#include "common/models/hf_weights.h"
#include "common/ops.h"

namespace inferlab::models::mamba {

namespace {

constexpr std::int64_t kMaxSize = 1 << 24;

bool lti_arch(const std::string& arch) { return arch == "InferLabLTIMambaForCausalLM"; }

// Chapter 01's config for the parts of the model that are chapter 01's: embed, final norm, head.
TransformerConfig skeleton_config(const MambaConfig& c) {
  TransformerConfig t;
  t.architecture = c.architecture;
  t.hidden_size = c.hidden_size;
  t.vocab_size = c.vocab_size;
  t.rms_norm_eps = c.eps;
  t.tie_word_embeddings = c.tie_word_embeddings;
  t.bos_token_id = c.bos_token_id;
  t.eos_token_ids = c.eos_token_ids;
  return t;
}

// A = −exp(A_log), the continuous-time decay rates (negative: the state forgets).
Tensor decay_rates(const Tensor& a_log) {
  Tensor A = Tensor::empty(a_log.shape(), DType::F32);
  const auto v = a_log.to_float_vector();
  for (std::size_t i = 0; i < v.size(); ++i) A.data<float>()[i] = -std::exp(v[i]);
  return A;
}

Tensor f32(const Tensor& t) { return t.dtype() == DType::F32 ? t.contiguous() : t.to(DType::F32); }

// Layer i under transformers' names from a getter get(name, shape).
template <class Get>
MambaLayer read_layer(const MambaConfig& c, std::int64_t i, Get&& get) {
  const std::int64_t D = c.hidden_size, E = c.inner_size, N = c.state_size, K = c.conv_kernel, R = c.dt_rank;
  const std::string p = "backbone.layers." + std::to_string(i) + ".";
  auto bias = [&](const std::string& n, std::int64_t size) { return c.use_bias ? f32(get(n, Shape{size})) : Tensor{}; };
  MambaLayer l;
  l.norm = f32(get(p + "norm.weight", Shape{D}));
  l.in_proj = Linear(f32(get(p + "mixer.in_proj.weight", Shape{2 * E, D})), bias(p + "mixer.in_proj.bias", 2 * E));
  l.conv_w = f32(get(p + "mixer.conv1d.weight", Shape{E, 1, K})).view({E, K});
  if (c.conv_bias) l.conv_b = f32(get(p + "mixer.conv1d.bias", Shape{E}));
  if (c.lti) {
    l.dt = f32(get(p + "mixer.dt", Shape{E}));
    l.B = f32(get(p + "mixer.B", Shape{E, N}));
    l.C = f32(get(p + "mixer.C", Shape{E, N}));
  } else {
    // x_proj's rows are (Δ of rank R, B, C); kept as two matrices so that each product is a
    // contiguous tensor on any device (dt_proj reads the first, the scan the second).
    const Tensor x_proj = f32(get(p + "mixer.x_proj.weight", Shape{R + 2 * N, E}));
    l.x_dt = x_proj.slice(0, 0, R).contiguous();
    l.x_bc = x_proj.slice(0, R, R + 2 * N).contiguous();
    l.dt_proj = Linear(f32(get(p + "mixer.dt_proj.weight", Shape{E, R})), f32(get(p + "mixer.dt_proj.bias", Shape{E})));
  }
  l.A = decay_rates(f32(get(p + "mixer.A_log", Shape{E, N})));
  l.D = f32(get(p + "mixer.D", Shape{E}));
  l.out_proj = Linear(f32(get(p + "mixer.out_proj.weight", Shape{D, E})), bias(p + "mixer.out_proj.bias", D));
  return l;
}

std::int64_t bytes_of(const Tensor& t) { return t.defined() ? static_cast<std::int64_t>(t.nbytes()) : 0; }
std::int64_t bytes_of(const Linear& l) { return l.defined() ? l.bytes() : 0; }

Tensor on(const Tensor& t, Device d) { return t.defined() ? t.to(d) : t; }
Linear on(const Linear& l, Device d) { return l.defined() ? l.to(d, DType::F32) : l; }

}  // namespace

// --- config ----------------------------------------------------------------------------------
std::int64_t MambaConfig::state_bytes(std::int64_t bytes_per_value) const {
  const char* what = "Mamba state bytes";
  return checked_mul(checked_mul(num_layers, inner_size, what),
                     checked_mul(conv_kernel - 1 + state_size, bytes_per_value, what), what);
}

std::int64_t MambaConfig::num_parameters() const {
  const std::int64_t D = hidden_size, E = inner_size, N = state_size, K = conv_kernel, R = dt_rank;
  std::int64_t layer = D + 2 * E * D + E * K + (conv_bias ? E : 0) + E * N + E + D * E + (use_bias ? 2 * E + D : 0);
  layer += lti ? E + 2 * E * N : (R + 2 * N) * E + E * R + E;
  return vocab_size * D + num_layers * layer + D + (tie_word_embeddings ? 0 : vocab_size * D);
}

void MambaConfig::validate(const std::string& where) const {
  for (const auto& [name, v] :
       std::initializer_list<std::pair<const char*, std::int64_t>>{{"hidden_size", hidden_size},
                                                                   {"intermediate size (expand · hidden_size)", inner_size},
                                                                   {"state_size", state_size},
                                                                   {"conv_kernel", conv_kernel},
                                                                   {"time_step_rank", dt_rank},
                                                                   {"num_hidden_layers", num_layers},
                                                                   {"vocab_size", vocab_size}})
    IL_CHECK(v >= 1 && v <= kMaxSize, where, ": ", name, " is ", v, "; it must be in [1, ", kMaxSize, "]");
  // The norm adds eps in float32: 1e300 would be infinite there (every output 0), 1e-50 zero.
  IL_CHECK(eps > 0 && eps <= std::numeric_limits<float>::max() && static_cast<float>(eps) > 0, where,
           ": layer_norm_epsilon must be positive and within float32's range; got ", eps);
  for (auto id : eos_token_ids)
    IL_CHECK(id >= 0 && id < vocab_size, where, ": eos_token_id ", id, " is outside the vocabulary of ", vocab_size);
  if (bos_token_id)
    IL_CHECK(*bos_token_id >= 0 && *bos_token_id < vocab_size, where, ": bos_token_id ", *bos_token_id,
             " is outside the vocabulary of ", vocab_size);
}

MambaConfig parse_mamba_config(const HfConfig& hf) {
  const std::string arch = hf.architecture(), type = hf.model_type();
  IL_CHECK(arch != "Mamba2ForCausalLM" && type != "mamba2", hf.path,
           ": a Mamba-2 model (SSD: scalar A per head, "
           "multi-head state); this chapter runs Mamba (MambaForCausalLM)");
  IL_CHECK(arch != "JambaForCausalLM" && type != "jamba", hf.path,
           ": a Jamba model (attention, Mamba and MoE "
           "layers); this chapter runs pure Mamba (MambaForCausalLM); its KV arithmetic is `ch07_mamba jamba`");
  IL_CHECK(arch == "MambaForCausalLM" || lti_arch(arch) || (arch.empty() && type == "mamba"), hf.path, ": architecture '",
           arch, "' (model_type '", type,
           "') is not a Mamba model; chapter 07 runs "
           "MambaForCausalLM (and tiny-lti's InferLabLTIMambaForCausalLM)");
  const JsonFields f(hf.json, hf.path);
  MambaConfig c;
  c.architecture = arch.empty() ? "MambaForCausalLM" : arch;
  c.lti = lti_arch(arch);
  // transformers' MambaConfig defaults, field by field.
  c.vocab_size = f.get_or<std::int64_t>("vocab_size", 50280);
  c.hidden_size = f.get_or<std::int64_t>("hidden_size", 768);
  c.state_size = f.get_or<std::int64_t>("state_size", 16);
  c.num_layers = f.get_or<std::int64_t>("num_hidden_layers", 32);
  c.eps = f.get_or<double>("layer_norm_epsilon", 1e-5);
  c.conv_kernel = f.get_or<std::int64_t>("conv_kernel", 4);
  c.use_bias = f.get_or<bool>("use_bias", false);
  c.conv_bias = f.get_or<bool>("use_conv_bias", true);
  c.tie_word_embeddings = f.get_or<bool>("tie_word_embeddings", true);
  // MambaConfig computes int(expand · hidden_size), and then PretrainedConfig sets every other
  // field of the file as given: a config's intermediate_size, when present, is the one used.
  const double expand = f.get_or<double>("expand", 2.0);
  // hidden_size first: a negative one passed the check below and overflowed the cast to int64.
  IL_CHECK(c.hidden_size >= 1 && c.hidden_size <= kMaxSize, hf.path, ": hidden_size is ", c.hidden_size,
           "; it must be in [1, ", kMaxSize, "]");
  IL_CHECK(expand > 0 && expand * static_cast<double>(c.hidden_size) < static_cast<double>(kMaxSize), hf.path,
           ": field 'expand' is ", expand, "; it must be positive and keep expand · hidden_size below ", kMaxSize);
  c.inner_size = f.has("intermediate_size") ? f.get<std::int64_t>("intermediate_size")
                                            : static_cast<std::int64_t>(expand * static_cast<double>(c.hidden_size));
  const std::string act = f.get_or<std::string>("hidden_act", "silu");
  IL_CHECK(act == "silu", hf.path, ": field 'hidden_act' is '", act, "'; Mamba's mixer runs silu");
  if (hf.json.contains("time_step_rank") && hf.json["time_step_rank"].is_string()) {
    const std::string r = hf.json["time_step_rank"].get<std::string>();
    IL_CHECK(r == "auto", hf.path, ": field 'time_step_rank' is '", r, "'; it must be an integer or \"auto\"");
    c.dt_rank = (c.hidden_size + 15) / 16;  // ceil(D / 16)
  } else {
    c.dt_rank = f.has("time_step_rank") ? f.get<std::int64_t>("time_step_rank") : (c.hidden_size + 15) / 16;
  }
  if (f.has("bos_token_id")) c.bos_token_id = f.get<std::int64_t>("bos_token_id");
  c.eos_token_ids = eos_token_ids(hf);
  c.validate(hf.path);
  return c;
}

// --- the model -------------------------------------------------------------------------------
std::int64_t MambaModel::step_weight_bytes() const {
  std::int64_t b = skeleton.step_weight_bytes();
  for (const MambaLayer& l : layers)
    for (const Tensor* t : {&l.norm, &l.conv_w, &l.conv_b, &l.dt, &l.B, &l.C, &l.A, &l.D}) b += bytes_of(*t);
  for (const MambaLayer& l : layers)
    for (const Linear* w : {&l.in_proj, &l.x_dt, &l.x_bc, &l.dt_proj, &l.out_proj}) b += bytes_of(*w);
  return b;
}

MambaModel MambaModel::to(Device d) const {
  MambaModel m;
  m.config = config;
  m.skeleton = skeleton.to(d, DType::F32);
  for (const MambaLayer& l : layers) {
    MambaLayer o;
    o.norm = on(l.norm, d), o.conv_w = on(l.conv_w, d), o.conv_b = on(l.conv_b, d), o.dt = on(l.dt, d);
    o.B = on(l.B, d), o.C = on(l.C, d), o.A = on(l.A, d), o.D = on(l.D, d);
    o.in_proj = on(l.in_proj, d), o.x_dt = on(l.x_dt, d), o.x_bc = on(l.x_bc, d), o.dt_proj = on(l.dt_proj, d);
    o.out_proj = on(l.out_proj, d);
    m.layers.push_back(std::move(o));
  }
  return m;
}

MambaModel load_mamba(const std::string& path) {
  const HfConfig hf = load_hf_config(path);
  MambaModel m;
  m.config = parse_mamba_config(hf);
  const MambaConfig& c = m.config;
  models::HfWeights get(hf, skeleton_config(c), path);
  m.skeleton.config = skeleton_config(c);
  m.skeleton.embed = f32(get("backbone.embeddings.weight", Shape{c.vocab_size, c.hidden_size}));
  for (std::int64_t i = 0; i < c.num_layers; ++i) m.layers.push_back(read_layer(c, i, get));
  m.skeleton.final_norm = f32(get("backbone.norm_f.weight", Shape{c.hidden_size}));
  m.skeleton.lm_head =
      c.tie_word_embeddings ? m.skeleton.embed : f32(get("lm_head.weight", Shape{c.vocab_size, c.hidden_size}));
  get.check_all_used("its num_hidden_layers, use_bias, use_conv_bias and architecture say which tensors a Mamba has");
  m.skeleton.source = path;
  return m;
}

MambaModel random_mamba(const MambaConfig& c, std::uint64_t seed) {
  c.validate("random_mamba");
  std::mt19937_64 rng(seed);
  auto uniform = [&](const Shape& s, float lo, float hi) {
    Tensor t = Tensor::empty(s, DType::F32);
    std::uniform_real_distribution<float> d(lo, hi);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
    return t;
  };
  auto matrix = [&](std::int64_t out, std::int64_t in) {
    const float a = 1.0f / std::sqrt(static_cast<float>(in));
    return uniform({out, in}, -a, a);
  };
  // Δ = softplus(dt) log-uniform in [0.001, 0.1]: dt = Δ + log(1 − e^−Δ), softplus's inverse.
  auto step_sizes = [&](std::int64_t E) {
    Tensor t = uniform({E}, std::log(1e-3f), std::log(1e-1f));
    for (std::int64_t i = 0; i < E; ++i) {
      const float d = std::exp(t.data<float>()[i]);
      t.data<float>()[i] = d + std::log(-std::expm1(-d));
    }
    return t;
  };
  const std::int64_t D = c.hidden_size, E = c.inner_size, N = c.state_size, K = c.conv_kernel;
  auto get = [&](const std::string& name, const Shape& s) -> Tensor {
    auto ends = [&](const char* suffix) {
      return name.size() >= std::string(suffix).size() &&
             name.compare(name.size() - std::string(suffix).size(), std::string::npos, suffix) == 0;
    };
    if (ends("norm.weight") || ends("norm_f.weight")) return uniform(s, 0.8f, 1.2f);
    if (ends("A_log")) {  // S4D-real: A = −(1, 2, ..., N) in every channel
      Tensor t = Tensor::empty(s, DType::F32);
      for (std::int64_t e = 0; e < E; ++e)
        for (std::int64_t n = 0; n < N; ++n) t.data<float>()[e * N + n] = std::log(static_cast<float>(n + 1));
      return t;
    }
    if (ends("mixer.D")) return uniform(s, 1.0f, 1.0f);
    if (ends("conv1d.weight"))
      return uniform(s, -1.0f / std::sqrt(static_cast<float>(K)), 1.0f / std::sqrt(static_cast<float>(K)));
    if (ends("dt_proj.bias") || ends("mixer.dt")) return step_sizes(E);
    if (ends("mixer.B") || ends("mixer.C"))
      return uniform(s, -1.0f / std::sqrt(static_cast<float>(N)), 1.0f / std::sqrt(static_cast<float>(N)));
    if (ends(".bias")) return uniform(s, -0.1f, 0.1f);
    if (s.size() == 2) return matrix(s[0], s[1]);
    return uniform(s, -0.1f, 0.1f);
  };
  MambaModel m;
  m.config = c;
  m.skeleton.config = skeleton_config(c);
  m.skeleton.embed = uniform({c.vocab_size, D}, -1.0f, 1.0f);
  for (std::int64_t i = 0; i < c.num_layers; ++i) m.layers.push_back(read_layer(c, i, get));
  m.skeleton.final_norm = uniform({D}, 0.8f, 1.2f);
  m.skeleton.lm_head = c.tie_word_embeddings ? m.skeleton.embed : matrix(c.vocab_size, D);
  m.skeleton.source = "random (seed " + std::to_string(seed) + ")";
  return m;
}

// --- the state -------------------------------------------------------------------------------
MambaState::MambaState(const MambaConfig& c, Device device) : config_(c), device_(device) {
  c.validate("MambaState");
  for (std::int64_t l = 0; l < c.num_layers; ++l) {
    conv_.push_back(Tensor::zeros({c.conv_kernel - 1, c.inner_size}, DType::F32, device));
    ssm_.push_back(Tensor::zeros({c.inner_size, c.state_size}, DType::F32, device));
  }
}

std::unique_ptr<models::Cache> MambaState::clone() const {
  IL_CHECK(!released_, "Mamba state: used after release()");
  auto s = std::make_unique<MambaState>(*this);  // the tensors are handles: give the copy storage of its own
  for (Tensor& t : s->conv_) t = t.clone();
  for (Tensor& t : s->ssm_) t = t.clone();
  return s;
}

void MambaState::commit(std::int64_t T) {
  IL_CHECK(!released_, "Mamba state: used after release()");
  IL_CHECK(T >= 0, "Mamba state: commit of ", T, " positions");
  length_ = checked_add(length_, T, "Mamba state length");
}

void MambaState::truncate(std::int64_t n) {
  IL_CHECK(!released_, "Mamba state: used after release()");
  IL_CHECK(n >= 0 && n <= length_, "Mamba state: truncate(", n, ") outside 0 .. ", length_);
  if (n == length_) return;
  IL_CHECK(n == 0, "Mamba state: cannot roll back from position ", length_, " to ", n,
           ": the state is a running summary that keeps no earlier positions (keep a copy of the state "
           "from before the tokens you may undo, as speculative decoding does, or start over with truncate(0))");
  for (auto& t : conv_) t = Tensor::zeros(t.shape(), DType::F32, device_);
  for (auto& t : ssm_) t = Tensor::zeros(t.shape(), DType::F32, device_);
  length_ = 0;
}

std::int64_t MambaState::bytes() const { return released_ ? 0 : config_.state_bytes(4); }

void MambaState::release() {
  conv_.clear(), ssm_.clear();
  released_ = true;
}

std::string MambaState::layout() const {
  std::ostringstream s;
  s << config_.num_layers << " layers × (conv [" << config_.conv_kernel - 1 << ", " << config_.inner_size << "] + ssm ["
    << config_.inner_size << ", " << config_.state_size << "]) f32 = " << bytes() << " bytes";
  return s.str();
}

void MambaState::check_layer(std::int64_t layer) const {
  IL_CHECK(!released_, "Mamba state: used after release()");
  IL_CHECK(layer >= 0 && layer < config_.num_layers, "Mamba state: layer ", layer, " outside 0 .. ", config_.num_layers - 1);
}

Tensor& MambaState::conv(std::int64_t layer) {
  check_layer(layer);
  return conv_[static_cast<std::size_t>(layer)];
}

Tensor& MambaState::ssm(std::int64_t layer) {
  check_layer(layer);
  return ssm_[static_cast<std::size_t>(layer)];
}

// --- the forward pass ------------------------------------------------------------------------
Tensor mixer_block(const MambaModel& m, std::int64_t layer, const Tensor& h, const models::Batch& batch, ScanPath path) {
  const MambaConfig& c = m.config;
  const MambaLayer& l = m.layers[static_cast<std::size_t>(layer)];
  const std::int64_t T = h.size(0), E = c.inner_size, N = c.state_size;
  const Tensor xz = linear(h, l.in_proj);  // [T, 2E]: the input branch x, then the gate z
  Tensor u = Tensor::empty({T, E}, DType::F32, h.device());
  const std::vector<std::int64_t>& begin = batch.begin;
  auto state = [&](std::size_t b) -> MambaState& { return batch.cache<MambaState>(b, "a MambaState"); };
  for (std::size_t b = 0; b < batch.caches.size(); ++b) {  // the convolution reads each sequence's own last inputs
    Tensor u_b = u.slice(0, begin[b], begin[b + 1]);
    const Tensor x_b = xz.slice(0, begin[b], begin[b + 1]).slice(1, 0, E);
    Tensor& conv_state = state(b).conv(layer);
    if (path == ScanPath::Reference) ref::causal_conv(x_b, l.conv_w, l.conv_b, conv_state, u_b);
    else causal_conv(x_b, l.conv_w, l.conv_b, conv_state, u_b);
  }
  Tensor bc, dt;  // the selection: Δ (rank R), B and C of every token, from the token
  if (!c.lti) {
    bc = linear(u, l.x_bc);                     // [T, 2N]: B, then C
    dt = linear(linear(u, l.x_dt), l.dt_proj);  // [T, R] -> [T, E], softplus in the scan
  }
  Tensor y = Tensor::empty({T, E}, DType::F32, h.device());
  for (std::size_t b = 0; b < batch.caches.size(); ++b) {
    const std::int64_t r0 = begin[b], r1 = begin[b + 1];
    ScanInputs in;
    in.u = u.slice(0, r0, r1), in.z = xz.slice(0, r0, r1).slice(1, E, 2 * E), in.A = l.A, in.D = l.D;
    if (c.lti) {
      in.dt = l.dt, in.B = l.B, in.C = l.C, in.lti = true;
    } else {
      in.dt = dt.slice(0, r0, r1);
      in.B = bc.slice(0, r0, r1).slice(1, 0, N), in.C = bc.slice(0, r0, r1).slice(1, N, 2 * N);
    }
    Tensor y_b = y.slice(0, r0, r1);
    Tensor& ssm = state(b).ssm(layer);
    switch (path) {
      case ScanPath::Reference: ref::selective_scan(in, ssm, y_b); break;
      case ScanPath::Fast: selective_scan(in, ssm, y_b); break;
      case ScanPath::Parallel: parallel_scan(in, ssm, y_b); break;
      case ScanPath::Convolution: lti_convolution(in, ssm, y_b); break;
    }
  }
  return linear(y, l.out_proj);
}

Tensor forward(const MambaModel& m, std::vector<SequenceStep>& seqs, ScanPath path) {
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    const auto* s = dynamic_cast<const MambaState*>(seqs[b].cache);
    IL_CHECK(s != nullptr, "forward: sequence ", b, " has no MambaState");
    IL_CHECK(s->device() == m.device(), "forward: sequence ", b, "'s state is on ", device_name(s->device()),
             ", the model on ", device_name(m.device()));
    IL_CHECK(path != ScanPath::Convolution || s->length() == 0,
             "forward: the convolution path runs from an empty state; sequence ", b, " has ", s->length(),
             " positions (decode with the scan)");
  }
  const models::Batch batch(std::nullopt, m.device(), seqs);  // chapter 02's rows; a state has no context limit
  Tensor x = models::embed(m.skeleton, batch.tokens);         // [rows, D]: the residual stream (chapter 01's)
  for (std::size_t i = 0; i < m.layers.size(); ++i) {
    const Tensor h = models::norm(m.skeleton, x, m.layers[i].norm);
    x = ops::add(x, mixer_block(m, static_cast<std::int64_t>(i), h, batch, path));  // no MLP: the mixer is the block
  }
  for (SequenceStep& s : seqs) s.cache->commit(static_cast<std::int64_t>(s.tokens.size()));
  return models::head(m.skeleton, batch.logits_input(x));
}

Tensor forward_cached(const MambaModel& m, MambaState& state, const std::vector<std::int32_t>& tokens, bool all_positions,
                      ScanPath path) {
  std::vector<SequenceStep> seqs = {{tokens, &state, all_positions}};
  return forward(m, seqs, path);
}

Tensor forward_sequence(const MambaModel& m, const std::vector<std::int32_t>& tokens, bool all_positions, ScanPath path) {
  MambaState state(m.config, m.device());
  return forward_cached(m, state, tokens, all_positions, path);
}

models::Generation generate(const MambaModel& m, const std::vector<std::int32_t>& prompt, int max_new, Sampler& sampler,
                            const std::vector<std::int64_t>& eos_ids, const models::OnToken& on_token) {
  return models::generate_with_cache(  // a fixed-size state: no context limit, no capacity
      std::nullopt, m.device(), prompt, max_new, sampler, eos_ids, on_token,
      [&](std::int64_t) { return MambaState(m.config, m.device()); },
      [&](MambaState& state, const std::vector<std::int32_t>& feed) { return forward_cached(m, state, feed); });
}

}  // namespace inferlab::models::mamba
