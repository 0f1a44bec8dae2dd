#include "common/models/model.h"

#include <filesystem>
#include <numeric>
#include <sstream>

#include "common/error.h"
#include "common/gguf.h"
#include "common/gguf_tokenizer.h"
#include "common/hf_config.h"
#include "common/models/cla.h"
#include "common/models/gguf_llama.h"
#include "common/models/local.h"
#include "common/models/mamba.h"
#include "common/models/mla.h"

namespace inferlab::models {

const char* layer_kind_name(LayerKind k) {
  switch (k) {
    case LayerKind::Attention: return "attention";
    case LayerKind::Window: return "window";
    case LayerKind::Latent: return "latent";
    case LayerKind::Shared: return "shared";
    case LayerKind::Recurrent: return "recurrent";
  }
  return "?";
}

namespace {

std::int64_t values_of(const std::vector<Shape>& shapes) {
  std::int64_t n = 0;
  for (const Shape& s : shapes) n += std::accumulate(s.begin(), s.end(), std::int64_t{1}, std::multiplies<>());
  return n;
}

}  // namespace

std::int64_t LayerSpec::row_values() const { return values_of(rows); }
std::int64_t LayerSpec::fixed_values() const { return values_of(fixed); }

std::int64_t LayerSpec::bytes(std::int64_t positions) const {
  return checked_mul(checked_add(checked_mul(positions, row_values(), "cache rows"), fixed_values(), "cache values"), 4,
                     "cache bytes");
}

std::int64_t LayerSpec::bytes_read(std::int64_t length, const std::vector<LayerSpec>& all) const {
  switch (kind) {
    case LayerKind::Attention:
    case LayerKind::Latent: return 4 * length * row_values();
    case LayerKind::Shared: return all.at(static_cast<std::size_t>(source)).bytes_read(length, all);
    case LayerKind::Window: return 4 * std::min(length, sinks + window) * (fixed_values() / (sinks + window));
    case LayerKind::Recurrent: return 4 * fixed_values();
  }
  return 0;
}

double Model::step_bytes(const std::vector<std::int64_t>& lengths) const {
  double b = static_cast<double>(step_weight_bytes());
  for (std::int64_t len : lengths)
    for (const LayerSpec& l : layers()) b += static_cast<double>(l.bytes_read(len, layers()));
  return b;
}

std::int64_t Model::cache_bytes(std::int64_t positions) const {
  std::int64_t b = 0;
  for (const LayerSpec& l : layers()) b = checked_add(b, l.bytes(positions), "cache bytes");
  return b;
}

std::string Model::describe_layers() const {
  // Runs of equal kinds (and windows), in layer order: "4 layers: 3 window (W = 64), 1 attention".
  std::vector<std::pair<std::string, int>> runs;
  for (const LayerSpec& l : layers()) {
    std::string k = layer_kind_name(l.kind);
    if (l.kind == LayerKind::Window) k += " (W = " + std::to_string(l.window) + ")";
    bool found = false;
    for (auto& [name, n] : runs)
      if (name == k) ++n, found = true;
    if (!found) runs.emplace_back(k, 1);
  }
  std::ostringstream os;
  os << layers().size() << " layers:";
  for (std::size_t i = 0; i < runs.size(); ++i) os << (i ? ", " : " ") << runs[i].second << " " << runs[i].first;
  return os.str();
}

std::vector<LayerSpec> attention_layers(const TransformerConfig& c) {
  LayerSpec a;
  a.kind = LayerKind::Attention;
  a.rows = {{c.num_kv_heads, c.head_dim}, {c.num_kv_heads, c.head_dim}};
  a.attention = attention_params(c);
  return std::vector<LayerSpec>(static_cast<std::size_t>(c.num_layers), a);
}

namespace {

std::int64_t linear_bytes(const Linear& l) { return l.defined() ? l.bytes() : 0; }

// The parts every Llama-based family shares: the base decoder's config, tokens and bytes.
class DecoderBased : public Model {
 public:
  const std::string& architecture() const override { return base().config.architecture; }
  const std::string& source() const override { return base().source; }
  std::int64_t vocab_size() const override { return base().config.vocab_size; }
  std::optional<std::int64_t> context() const override { return base().config.max_position_embeddings; }
  Device device() const override { return base().device(); }
  std::vector<std::int64_t> eos_ids() const override { return base().config.eos_token_ids; }
  std::optional<std::int64_t> bos_id() const override { return base().config.bos_token_id; }
  const std::vector<LayerSpec>& layers() const override { return layers_; }
  std::int64_t step_weight_bytes() const override { return base().step_weight_bytes(); }

 protected:
  virtual const Llama& base() const = 0;
  std::vector<LayerSpec> layers_;
};

class LlamaModel final : public DecoderBased {
 public:
  explicit LlamaModel(Llama m) : m_(std::move(m)) { layers_ = attention_layers(m_.config); }
  Tensor forward(std::vector<SequenceStep>& seqs, AttendPath path) const override {
    return models::forward(m_, seqs, attention_block, path);
  }
  std::unique_ptr<Cache> make_cache(std::int64_t capacity) const override {
    return std::make_unique<ContiguousKVCache>(m_.config, capacity, m_.device());
  }
  const Llama* llama() const override { return &m_; }

 private:
  const Llama& base() const override { return m_; }
  Llama m_;
};

class LocalAdapter final : public DecoderBased {
 public:
  explicit LocalAdapter(local::LocalModel m) : m_(std::move(m)) {
    const TransformerConfig& c = m_.base.config;
    layers_ = attention_layers(c);
    for (std::int64_t l = 0; l < c.num_layers; ++l) {
      if (!m_.layout.is_local(l)) continue;
      LayerSpec& s = layers_[static_cast<std::size_t>(l)];
      s.kind = LayerKind::Window;
      s.window = m_.layout.window[static_cast<std::size_t>(l)], s.sinks = m_.layout.sinks;
      s.fixed = {{s.sinks + s.window, c.num_kv_heads, c.head_dim}, {s.sinks + s.window, c.num_kv_heads, c.head_dim}};
      s.rows.clear();
    }
  }
  Tensor forward(std::vector<SequenceStep>& seqs, AttendPath path) const override {
    return models::forward(m_.base, seqs, attention_block, path);  // the windows are the caches' business
  }
  std::unique_ptr<Cache> make_cache(std::int64_t capacity) const override {
    return std::make_unique<local::RingKVCache>(m_.base.config, m_.layout, capacity, m_.base.device());
  }
  std::unique_ptr<Cache> make_fixed_cache() const override {
    return std::make_unique<local::RingKVCache>(local::RingKVCache::rings_only(m_.base.config, m_.layout, m_.base.device()));
  }

 private:
  const Llama& base() const override { return m_.base; }
  local::LocalModel m_;
};

class MlaAdapter final : public DecoderBased {
 public:
  MlaAdapter(mla::MlaModel m, mla::MlaPath path) : m_(std::move(m)), path_(path) {
    LayerSpec s;
    s.kind = LayerKind::Latent;
    s.rows = {{1, m_.mla.latent_dim()}};
    s.attention.scale = m_.mla.softmax_scale();
    layers_.assign(static_cast<std::size_t>(m_.config().num_layers), s);
  }
  Tensor forward(std::vector<SequenceStep>& seqs, AttendPath) const override { return mla::forward(m_, seqs, path_); }
  std::unique_ptr<Cache> make_cache(std::int64_t capacity) const override {
    return std::make_unique<mla::LatentCache>(m_.config(), m_.mla, capacity, m_.base.device());
  }
  std::int64_t step_weight_bytes() const override {
    std::int64_t b = m_.base.step_weight_bytes();  // every weight but attention's
    for (const mla::MlaAttention& a : m_.attn) {
      for (const Linear* w : {&a.wq, &a.wq_a, &a.wq_b, &a.wkv_a, &a.wkv_b, &a.wo}) b += linear_bytes(*w);
      for (const Tensor* t : {&a.q_a_norm, &a.kv_a_norm}) b += t->defined() ? static_cast<std::int64_t>(t->nbytes()) : 0;
    }
    return b;
  }

 private:
  const Llama& base() const override { return m_.base; }
  mla::MlaModel m_;
  mla::MlaPath path_;
};

class ClaAdapter final : public DecoderBased {
 public:
  explicit ClaAdapter(cla::ClaModel m) : m_(std::move(m)) {
    layers_ = attention_layers(m_.base.config);
    for (std::int64_t l = 0; l < m_.layout.layers(); ++l) {
      if (m_.layout.stores(l)) continue;
      LayerSpec& s = layers_[static_cast<std::size_t>(l)];
      s.kind = LayerKind::Shared;
      s.rows.clear();
      // The first layer of its group stores what it reads.
      const std::int64_t storage = m_.layout.storage[static_cast<std::size_t>(l)];
      for (std::int64_t j = 0; j < l; ++j)
        if (m_.layout.storage[static_cast<std::size_t>(j)] == storage && m_.layout.stores(j)) s.source = j;
      IL_CHECK(s.source >= 0, "CLA model: layer ", l, " reads storage layer ", storage, ", which no earlier layer stores");
    }
  }
  Tensor forward(std::vector<SequenceStep>& seqs, AttendPath) const override { return cla::forward(m_, seqs); }
  std::unique_ptr<Cache> make_cache(std::int64_t capacity) const override {
    return std::make_unique<cla::SharedKVCache>(m_.base.config, m_.layout, capacity, m_.base.device());
  }

 private:
  const Llama& base() const override { return m_.base; }
  cla::ClaModel m_;
};

class MambaAdapter final : public Model {
 public:
  explicit MambaAdapter(mamba::MambaModel m) : m_(std::move(m)) {
    const mamba::MambaConfig& c = m_.config;
    LayerSpec s;
    s.kind = LayerKind::Recurrent;
    s.fixed = {{c.conv_kernel - 1, c.inner_size}, {c.inner_size, c.state_size}};  // conv inputs, SSM state
    layers_.assign(static_cast<std::size_t>(c.num_layers), s);
  }
  const std::string& architecture() const override { return m_.config.architecture; }
  const std::string& source() const override { return m_.skeleton.source; }
  std::int64_t vocab_size() const override { return m_.config.vocab_size; }
  std::optional<std::int64_t> context() const override { return std::nullopt; }
  Device device() const override { return m_.device(); }
  std::vector<std::int64_t> eos_ids() const override { return m_.config.eos_token_ids; }
  std::optional<std::int64_t> bos_id() const override { return m_.config.bos_token_id; }
  const std::vector<LayerSpec>& layers() const override { return layers_; }
  Tensor forward(std::vector<SequenceStep>& seqs, AttendPath) const override { return mamba::forward(m_, seqs); }
  std::unique_ptr<Cache> make_cache(std::int64_t) const override {
    return std::make_unique<mamba::MambaState>(m_.config, m_.device());
  }
  std::unique_ptr<Cache> make_fixed_cache() const override { return make_cache(0); }
  std::int64_t step_weight_bytes() const override { return m_.step_weight_bytes(); }

 private:
  mamba::MambaModel m_;
  std::vector<LayerSpec> layers_;
};

bool is_gguf(const std::string& path) { return std::filesystem::path(path).extension() == ".gguf"; }

}  // namespace

std::unique_ptr<Model> as_model(Llama m) { return std::make_unique<LlamaModel>(std::move(m)); }
std::unique_ptr<Model> as_model(local::LocalModel m) {
  if (m.layout.locals() == 0) return as_model(std::move(m.base));  // no window: the plain model
  return std::make_unique<LocalAdapter>(std::move(m));
}
std::unique_ptr<Model> as_model(mla::MlaModel m) { return as_model(std::move(m), mla::MlaPath::Absorbed); }
std::unique_ptr<Model> as_model(mla::MlaModel m, mla::MlaPath path) {
  return std::make_unique<MlaAdapter>(std::move(m), path);
}
std::unique_ptr<Model> as_model(cla::ClaModel m) { return std::make_unique<ClaAdapter>(std::move(m)); }
std::unique_ptr<Model> as_model(mamba::MambaModel m) { return std::make_unique<MambaAdapter>(std::move(m)); }

namespace {

// A Llama-family decoder on `device`: a checkpoint's weights as f32 (the engine's kernels), a
// GGUF's block types packed (interleaved on the CPU).
Llama placed(Llama m, Device device, bool packed) {
  if (packed && device == Device::CPU) {
    interleave_blocks(m);
    return m;
  }
  return m.to(device, DType::F32);
}

void only_cpu(const std::string& path, const char* family, Device device) {
  IL_CHECK(device == Device::CPU, path, ": the engine runs ", family,
           " models on the CPU (their CUDA paths are their chapters' own)");
}

}  // namespace

std::unique_ptr<Model> load_model(const std::string& path, Device device) {
  namespace fs = std::filesystem;
  IL_CHECK(fs::exists(path), "cannot open model ", path, ": no such file or folder");
  if (is_gguf(path)) {
    const gguf::File f(path);
    const std::string arch = f.has("general.architecture") ? f.get_string("general.architecture") : "";
    if (arch == "deepseek2") {
      only_cpu(path, "DeepSeek (MLA)", device);
      return as_model(mla::load_mla(path));
    }
    if (arch == "gemma2" || arch == "gemma3") {
      local::LocalModel m = local::load_local(path);
      m.base = placed(std::move(m.base), device, true);
      return as_model(std::move(m));
    }
    return as_model(placed(load_gguf(f), device, true));  // llama, qwen2, qwen2moe, qwen3; others refused by name
  }
  if (!fs::is_directory(path) && fs::path(path).extension() == ".bin")  // llama2.c
    return as_model(placed(load_llama(path), device, false));
  const HfConfig hf = load_hf_config(path);
  const std::string arch = hf.architecture();
  if (arch == "DeepseekV2ForCausalLM" || arch == "DeepseekV3ForCausalLM") {
    only_cpu(path, "DeepSeek (MLA)", device);
    return as_model(mla::load_mla(path));
  }
  if (arch == "InferLabCLAForCausalLM") {
    cla::ClaModel m = cla::load_cla(path);
    m.base = m.base.to(device, DType::F32);
    return as_model(std::move(m));
  }
  if (arch == "MambaForCausalLM" || arch == "InferLabLTIMambaForCausalLM")
    return as_model(mamba::load_mamba(path).to(device));
  IL_CHECK(arch != "InferLabMDLMForMaskedDiffusion", hf.path,
           ": a masked-diffusion denoiser: it fills a block of masked positions at once, attending both ways, so there "
           "is no next token whose cache the engine could grow (chapter 08, ch08_diffusion_lm, runs it)");
  if (gemma_family(arch) || arch == "MinistralForCausalLM" || llama_family(arch)) {
    // Windows where the config has them (Mistral, Ministral, Qwen2, Gemma), else the plain decoder.
    local::LocalModel m = local::load_local(path);
    m.base = m.base.to(device, DType::F32);
    return as_model(std::move(m));
  }
  return as_model(placed(load_llama(path), device, false));  // the MoE Llamas; anything else refused by name
}

std::unique_ptr<Tokenizer> load_model_tokenizer(const Model& m, const std::string& explicit_path) {
  std::unique_ptr<Tokenizer> tok;
  if (is_gguf(m.source()) && explicit_path.empty()) {
    // The file's own (tokenizer.ggml.*), else one beside it, as gguf_tokenizer() finds them; the
    // vocabulary is the model's, whatever its family (DeepSeek's config is not a Llama's).
    const gguf::File f(m.source());
    if (f.has("tokenizer.ggml.model")) {
      tok = gguf::tokenizer(f);
    } else {
      tok = Tokenizer::for_model(m.source());
      IL_CHECK(tok->vocab_size() == m.vocab_size(), m.source(), " has no tokenizer of its own (tokenizer.ggml.*) and ",
               m.vocab_size(), " embedding rows, not the ", tok->vocab_size(), " tokens of ", tok->path(),
               "; pass the model's own tokenizer with --tokenizer");
    }
  } else if (is_gguf(m.source())) {
    tok = Tokenizer::load(explicit_path);
  } else {
    tok = Tokenizer::for_model(m.source(), explicit_path);
  }
  check_tokenizer_vocab(*tok, m.vocab_size(), m.source());
  return tok;
}

std::vector<std::int64_t> stop_ids(const Model& m) {
  std::vector<std::int64_t> ids;
  if (is_gguf(m.source())) ids = gguf::stop_ids(gguf::File(m.source()));  // EOS and end-of-turn, as llama.cpp stops
  for (std::int64_t e : m.eos_ids())
    if (std::find(ids.begin(), ids.end(), e) == ids.end()) ids.push_back(e);
  return ids;
}

}  // namespace inferlab::models
