#include "common/llama2c.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/input_file.h"
#include "common/regex.h"
#include "common/safetensors.h"

namespace inferlab {

namespace {

struct Header {
  std::int32_t dim, hidden, layers, heads, kv_heads, vocab, seq_len;
};

std::string layer_name(std::int64_t l, const char* rest) { return "model.layers." + std::to_string(l) + "." + rest; }

TransformerConfig config_of(const Header& h, bool shared, const std::string& path) {
  for (auto [name, v] : {std::pair{"dim", h.dim},
                         {"hidden_dim", h.hidden},
                         {"n_layers", h.layers},
                         {"n_heads", h.heads},
                         {"n_kv_heads", h.kv_heads},
                         {"vocab_size", h.vocab},
                         {"seq_len", h.seq_len}})
    IL_CHECK(v > 0 && v < (1 << 24), path, ": header field ", name, " = ", v,
             " is not plausible (is this a llama2.c checkpoint?)");
  IL_CHECK(h.dim % h.heads == 0, path, ": dim ", h.dim, " is not a multiple of n_heads ", h.heads);
  TransformerConfig c;
  c.architecture = "LlamaForCausalLM";
  c.hidden_size = h.dim, c.intermediate_size = h.hidden, c.num_layers = h.layers, c.num_heads = h.heads;
  c.num_kv_heads = h.kv_heads, c.head_dim = h.dim / h.heads, c.vocab_size = h.vocab;
  c.max_position_embeddings = h.seq_len, c.rms_norm_eps = 1e-5, c.rope_theta = 10000.0;
  c.tie_word_embeddings = shared, c.bos_token_id = 1, c.eos_token_ids = {2}, c.torch_dtype = "float32";
  // The project's shared rules and size limits (which also keep the byte counts below in range).
  c.validate(path + " (llama2.c header, named as in a config.json)");
  return c;
}

// The tensors of one kind, all layers, in file order.
struct Block {
  std::string name;  // with %d for the layer, or a plain name
  Shape shape;       // of one layer's tensor
  bool per_layer;
};

std::vector<Block> blocks_v0(const TransformerConfig& c) {
  const std::int64_t D = c.hidden_size, F = c.intermediate_size, Q = c.num_heads * c.head_dim,
                     KV = c.num_kv_heads * c.head_dim, V = c.vocab_size;
  return {{"model.embed_tokens.weight", {V, D}, false},
          {"input_layernorm.weight", {D}, true},
          {"self_attn.q_proj.weight", {Q, D}, true},
          {"self_attn.k_proj.weight", {KV, D}, true},
          {"self_attn.v_proj.weight", {KV, D}, true},
          {"self_attn.o_proj.weight", {D, Q}, true},
          {"post_attention_layernorm.weight", {D}, true},
          {"mlp.gate_proj.weight", {F, D}, true},
          {"mlp.down_proj.weight", {D, F}, true},
          {"mlp.up_proj.weight", {F, D}, true},
          {"model.norm.weight", {D}, false}};
}

std::vector<Block> blocks_v1(const TransformerConfig& c) {
  auto b = blocks_v0(c);
  // v1 puts the norms first: attention norms, MLP norms, final norm, then the embedding.
  return {b[1], b[6], b[10], b[0], b[2], b[3], b[4], b[5], b[7], b[8], b[9]};
}

// Walks `blocks` over float data, naming each layer's tensor.
template <class F>
void walk(const std::vector<Block>& blocks, std::int64_t layers, F&& f) {
  for (const auto& b : blocks) {
    const std::int64_t n = b.per_layer ? layers : 1;
    for (std::int64_t l = 0; l < n; ++l) f(b.per_layer ? layer_name(l, b.name.c_str()) : b.name, b.shape);
  }
}

// Floats in `blocks` over all layers. TransformerConfig::validate's limits keep the sum below
// 2^56, so it and the byte counts derived from it fit in 64 bits.
std::int64_t count_floats(const std::vector<Block>& blocks, std::int64_t layers) {
  std::int64_t n = 0;
  for (const auto& b : blocks) n += shape_numel(b.shape) * (b.per_layer ? layers : 1);
  return n;
}

}  // namespace

Llama2cCheckpoint load_llama2c(const std::string& path) {
  auto file = std::make_shared<MappedFile>(path, "llama2.c checkpoint");
  const unsigned char* base = file->data();
  const std::size_t size = file->size();
  IL_CHECK(size >= 28, path, ": ", size, " bytes is too short for a llama2.c header");
  Llama2cCheckpoint ck;
  ck.path = path;
  std::uint32_t magic;
  std::memcpy(&magic, base, 4);
  Header h{};
  bool shared;
  std::size_t offset;
  std::int32_t group = 0;
  if (magic == 0x616b3432) {  // "ak42": v1 or v2
    IL_CHECK(size >= 256, path, ": truncated 256-byte header");
    std::memcpy(&ck.version, base + 4, 4);
    IL_CHECK(ck.version == 1 || ck.version == 2, path, ": llama2.c version ", ck.version, " is not supported (0, 1, 2)");
    std::memcpy(&h, base + 8, sizeof h);
    shared = base[8 + sizeof h] != 0;
    if (ck.version == 2) std::memcpy(&group, base + 9 + sizeof h, 4);
    offset = 256;
  } else {
    std::memcpy(&h, base, sizeof h);
    shared = h.vocab > 0;  // v0: the sign of vocab_size says whether the classifier is shared
    // -2^31 has no positive counterpart (std::abs of it is undefined).
    IL_CHECK(h.vocab != INT32_MIN, path, ": header field vocab_size = ", h.vocab,
             " is not plausible (is this a llama2.c checkpoint?)");
    h.vocab = std::abs(h.vocab);
    offset = sizeof h;
  }
  ck.config = config_of(h, shared, path);
  const TransformerConfig& c = ck.config;
  const auto V = c.vocab_size, D = c.hidden_size;

  auto view = [&](std::size_t at, const Shape& s) {
    return Tensor::wrap(const_cast<unsigned char*>(base + at), s, DType::F32, Device::CPU, file);
  };
  if (ck.version == 0 || ck.version == 1) {
    const auto blocks = ck.version == 0 ? blocks_v0(c) : blocks_v1(c);
    std::int64_t floats = count_floats(blocks, c.num_layers);
    if (ck.version == 0) floats += c.max_position_embeddings * c.head_dim;  // the unused RoPE tables
    if (!shared) floats += V * D;
    const std::size_t want = offset + static_cast<std::size_t>(floats) * 4;
    IL_CHECK(size == want, path, ": the header (dim ", D, ", ", c.num_layers, " layers, vocab ", V, ") implies ", want,
             " bytes but the file has ", size, size < want ? " (truncated?)" : " (not a llama2.c v0/v1 file?)");
    std::size_t at = offset;
    walk(blocks, c.num_layers, [&](const std::string& name, const Shape& s) {
      ck.tensors[name] = view(at, s);
      at += static_cast<std::size_t>(shape_numel(s)) * 4;
    });
    if (ck.version == 0) at += static_cast<std::size_t>(c.max_position_embeddings * c.head_dim) * 4;
    if (!shared) ck.tensors["lm_head.weight"] = view(at, {V, D});
    return ck;
  }
  // v2: float32 norms, then Q8_0 tensors (int8 values, then one float32 scale per group).
  IL_CHECK(group > 0, path, ": group size ", group, " must be positive");
  const auto all = blocks_v1(c);
  const std::vector<Block> norms(all.begin(), all.begin() + 3), quant(all.begin() + 3, all.end());
  std::size_t at = offset;
  std::size_t need = offset + static_cast<std::size_t>(count_floats(norms, c.num_layers)) * 4;
  walk(quant, c.num_layers, [&](const std::string&, const Shape& s) {
    need += static_cast<std::size_t>(shape_numel(s)) + static_cast<std::size_t>(shape_numel(s) / group) * 4;
  });
  if (!shared) need += static_cast<std::size_t>(V * D) + static_cast<std::size_t>(V * D / group) * 4;
  IL_CHECK(size == need, path, ": the v2 header implies ", need, " bytes but the file has ", size);
  walk(norms, c.num_layers, [&](const std::string& name, const Shape& s) {
    ck.tensors[name] = view(at, s);
    at += static_cast<std::size_t>(shape_numel(s)) * 4;
  });
  auto dequant = [&](const std::string& name, const Shape& s) {
    with_context(path + ": tensor " + name, [&] {  // names the tensor if its allocation fails
      const std::int64_t n = shape_numel(s);
      IL_CHECK(n % group == 0, "it has ", n, " values, not a multiple of the group size ", group);
      Tensor t = Tensor::empty(s, DType::F32);
      const auto* q = reinterpret_cast<const std::int8_t*>(base + at);
      std::vector<float> scales(static_cast<std::size_t>(n / group));
      std::memcpy(scales.data(), base + at + n, scales.size() * 4);
      for (std::int64_t i = 0; i < n; ++i) t.data<float>()[i] = q[i] * scales[static_cast<std::size_t>(i / group)];
      at += static_cast<std::size_t>(n) + scales.size() * 4;
      ck.tensors[name] = t;
    });
  };
  walk(quant, c.num_layers, dequant);
  if (!shared) dequant("lm_head.weight", {V, D});
  return ck;
}

void save_llama2c(const std::string& path, const TransformerConfig& c, const std::map<std::string, Tensor>& tensors) {
  auto narrow = [&](std::int64_t v, const char* what) {
    IL_CHECK(v > 0 && v < (std::int64_t{1} << 31), "save_llama2c: ", what, " = ", v, " does not fit the header");
    return static_cast<std::int32_t>(v);
  };
  IL_CHECK(c.head_dim * c.num_heads == c.hidden_size, "save_llama2c: llama2.c needs head_dim × heads = dim");
  const Header h{narrow(c.hidden_size, "dim"),
                 narrow(c.intermediate_size, "hidden_dim"),
                 narrow(c.num_layers, "n_layers"),
                 narrow(c.num_heads, "n_heads"),
                 narrow(c.num_kv_heads, "n_kv_heads"),
                 narrow(c.vocab_size, "vocab_size") * (c.tie_word_embeddings ? 1 : -1),
                 narrow(c.max_position_embeddings, "seq_len")};
  AtomicFile out(path);  // nothing at `path` unless every tensor below is written
  out.write(&h, sizeof h);
  auto put = [&](const std::string& name, const Shape& s) {
    auto it = tensors.find(name);
    IL_CHECK(it != tensors.end(), "save_llama2c: no tensor '", name, "'");
    IL_CHECK(it->second.shape() == s, "save_llama2c: tensor '", name, "' has shape ", shape_str(it->second.shape()),
             ", expected ", shape_str(s));
    const Tensor f = it->second.to(Device::CPU).to(DType::F32);
    out.write(f.raw_data(), f.nbytes());
  };
  walk(blocks_v0(c), c.num_layers, put);
  // The RoPE tables run.c used to read (cos, then sin, of pos · θ^(-2j/H)).
  const std::int64_t half = c.head_dim / 2;
  for (int part = 0; part < 2; ++part)
    for (std::int64_t p = 0; p < c.max_position_embeddings; ++p)
      for (std::int64_t j = 0; j < half; ++j) {
        const double a =
            static_cast<double>(p) * std::pow(c.rope_theta, -2.0 * static_cast<double>(j) / static_cast<double>(c.head_dim));
        const float v = static_cast<float>(part == 0 ? std::cos(a) : std::sin(a));
        out.write(&v, 4);
      }
  if (!c.tie_word_embeddings) put("lm_head.weight", {c.vocab_size, c.hidden_size});
  out.commit();
}

Tensor permute_rope_rows(const Tensor& w_in, std::int64_t heads, bool to_half_split) {
  const Tensor w = w_in.contiguous();
  IL_CHECK(w.ndim() == 2 && heads > 0 && w.size(0) % heads == 0 && (w.size(0) / heads) % 2 == 0,
           "permute_rope_rows: ", w.describe(), " cannot be split into ", heads, " heads of even size");
  const std::int64_t H = w.size(0) / heads, half = H / 2;
  const std::size_t row = static_cast<std::size_t>(w.size(1)) * dtype_size(w.dtype());
  Tensor out = Tensor::empty(w.shape(), w.dtype(), Device::CPU);
  const Tensor src = w.is_cuda() ? w.to(Device::CPU) : w;
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t j = 0; j < half; ++j)
      for (std::int64_t e = 0; e < 2; ++e) {
        const std::int64_t adjacent = h * H + 2 * j + e, split = h * H + e * half + j;
        const std::int64_t from = to_half_split ? adjacent : split, to = to_half_split ? split : adjacent;
        std::memcpy(static_cast<char*>(out.raw_data()) + static_cast<std::size_t>(to) * row,
                    static_cast<const char*>(src.raw_data()) + static_cast<std::size_t>(from) * row, row);
      }
  return w.is_cuda() ? out.to(Device::CUDA) : out;
}

// --- tokenizer -------------------------------------------------------------------------------

Llama2cTokenizer Llama2cTokenizer::load(const std::string& path) {
  require_regular_file(path, "llama2.c tokenizer");
  std::ifstream in(path, std::ios::binary);
  IL_CHECK(in.good(), "cannot open ", path, ": ", std::strerror(errno));
  Llama2cTokenizer t;
  t.path_ = path;
  std::int32_t max_len = 0;
  IL_CHECK(in.read(reinterpret_cast<char*>(&max_len), 4) && max_len > 0 && max_len < 4096, path,
           ": not a llama2.c tokenizer (bad max_token_length)");
  while (in.peek() != EOF) {
    float score;
    std::int32_t len;
    const auto id = checked_cast<std::int32_t>(t.pieces_.size(), path + ": token count");
    IL_CHECK(in.read(reinterpret_cast<char*>(&score), 4) && in.read(reinterpret_cast<char*>(&len), 4), path, ": token ", id,
             " is truncated");
    IL_CHECK(len >= 0 && len <= max_len, path, ": token ", id, " has length ", len, " (max_token_length ", max_len, ")");
    IL_CHECK(std::isfinite(score), path, ": token ", id, " has score ", score,
             " (merges are ranked by score: it must be finite)");
    std::string piece(static_cast<std::size_t>(len), '\0');
    IL_CHECK(in.read(piece.data(), len), path, ": token ", id, " is truncated");
    t.lookup_.emplace(piece, id);  // the first of duplicates wins, as in run.c
    t.pieces_.push_back(std::move(piece));
    t.scores_.push_back(score);
  }
  IL_CHECK(t.pieces_.size() > 3, path, ": no tokens");
  return t;
}

void Llama2cTokenizer::check_vocab(std::int64_t model_vocab, const std::string& model) const {
  IL_CHECK(vocab_size() == model_vocab, path_, ": ", vocab_size(), " tokens, but ", model, " has a vocabulary of ",
           model_vocab, " (a llama2.c tokenizer must match it exactly: truncated, or for another model?)");
}

namespace {
namespace fs = std::filesystem;

bool is_tokenizer_bin(const std::string& path) {
  // Not is_regular_file: a FIFO named .bin must reach the reader, which refuses it by name.
  return !fs::is_directory(path) && fs::path(path).extension() == ".bin";
}

std::unique_ptr<Tokenizer> load_tokenizer_bin(const std::string& path) {
  return std::make_unique<Llama2cTokenizer>(Llama2cTokenizer::load(path));
}

std::string tokenizer_bin_beside(const std::string& model_path) {
  if (fs::path(model_path).extension() != ".bin") return "";
  const fs::path dir = fs::path(model_path).parent_path();
  if (fs::exists(dir / "tokenizer.bin")) return (dir / "tokenizer.bin").string();
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(dir.empty() ? fs::path(".") : dir))
    if (e.path().filename().string().rfind("tok", 0) == 0 && e.path().extension() == ".bin") found.push_back(e.path());
  IL_CHECK(found.size() == 1, "cannot tell which tokenizer goes with ", model_path, ": found ", found.size(),
           " tokenizer.bin/tok*.bin files beside it (name one with --tokenizer)");
  return found[0].string();
}
}  // namespace

TokenizerFormat llama2c_tokenizer_format() { return {is_tokenizer_bin, load_tokenizer_bin, tokenizer_bin_beside}; }

const std::string& Llama2cTokenizer::id_to_token(std::int32_t id) const {
  IL_CHECK(id >= 0 && id < vocab_size(), "token id ", id, " is outside the vocabulary [0, ", vocab_size(), ")");
  return pieces_[static_cast<std::size_t>(id)];
}

std::optional<std::int32_t> Llama2cTokenizer::token_to_id(std::string_view token) const {
  auto it = lookup_.find(token);
  if (it == lookup_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::int32_t> Llama2cTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  validate_utf8(text, "tokenizer input");
  std::vector<std::int32_t> ids;
  if (add_special_tokens) ids.push_back(1);
  if (!text.empty()) {  // SentencePiece's dummy prefix
    auto sp = token_to_id(" ");
    IL_CHECK(sp.has_value(), path_, ": no ' ' token for the dummy prefix");
    ids.push_back(*sp);
  }
  for (auto ch : utf8_chars(text)) {
    if (auto id = token_to_id(ch)) {
      ids.push_back(*id);
      continue;
    }
    for (unsigned char b : ch) {  // byte fallback
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      auto id = token_to_id(name);
      IL_CHECK(id.has_value(), path_, ": no piece for '", std::string(ch), "' and no byte token ", name);
      ids.push_back(*id);
    }
  }
  // Merge the adjacent pair whose concatenation scores highest (the first such pair on ties).
  const std::size_t first = add_special_tokens ? 1 : 0;
  while (true) {
    float best = -1e10f;
    std::size_t at = 0;
    std::int32_t best_id = -1;
    for (std::size_t i = first; i + 1 < ids.size(); ++i) {
      const std::string merged = pieces_[static_cast<std::size_t>(ids[i])] + pieces_[static_cast<std::size_t>(ids[i + 1])];
      auto id = token_to_id(merged);
      if (id && scores_[static_cast<std::size_t>(*id)] > best)
        best = scores_[static_cast<std::size_t>(*id)], best_id = *id, at = i;
    }
    if (best_id < 0) break;
    ids[at] = best_id;
    ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
  return ids;
}

std::string Llama2cTokenizer::decode(const std::vector<std::int32_t>& ids, bool skip_special_tokens) const {
  std::string out;
  std::int32_t prev = -1;
  for (std::int32_t id : ids) {
    std::string_view piece = id_to_token(id);
    if (!(skip_special_tokens && is_special(id))) {
      if (prev == 1 && !piece.empty() && piece[0] == ' ') piece.remove_prefix(1);
      unsigned int byte;
      if (piece.size() == 6 && std::sscanf(std::string(piece).c_str(), "<0x%02X>", &byte) == 1)
        out += static_cast<char>(byte);
      else out += piece;
    }
    prev = id;
  }
  return out;
}

std::string Llama2cTokenizer::to_tokenizer_json() const {
  using nlohmann::json;
  const std::string meta = "\xE2\x96\x81";
  auto spm = [&](const std::string& p) {  // llama2.c stores "▁" as a space
    std::string o;
    for (char ch : p) o += ch == ' ' ? meta : std::string(1, ch);
    return o;
  };
  json vocab = json::object();
  for (std::size_t i = 3; i < pieces_.size(); ++i) vocab[spm(pieces_[i])] = i;
  vocab["<unk>"] = 0, vocab["<s>"] = 1, vocab["</s>"] = 2;
  // A merge (a, b) for every piece that splits into two pieces, ranked by the merged piece's
  // score: what SentencePiece's BPE does, expressed as ranked merges.
  struct M {
    float score;
    std::string a, b;
    std::size_t la, lb;
  };
  std::vector<M> merges;
  for (std::size_t i = 3; i < pieces_.size(); ++i) {
    const std::string p = spm(pieces_[i]);
    const auto chars = utf8_chars(p);
    std::string left;
    for (std::size_t k = 0; k + 1 < chars.size(); ++k) {
      left += chars[k];
      const std::string right = p.substr(left.size());
      if (vocab.contains(left) && vocab.contains(right))
        merges.push_back({scores_[i], left, right, left.size(), right.size()});
    }
  }
  std::stable_sort(merges.begin(), merges.end(), [](const M& x, const M& y) { return x.score > y.score; });
  json jm = json::array();
  for (const auto& m : merges) jm.push_back(json::array({m.a, m.b}));
  auto special = [](int id, const char* s) {
    return json{{"id", id},        {"content", s},        {"single_word", false}, {"lstrip", false},
                {"rstrip", false}, {"normalized", false}, {"special", true}};
  };
  json j = {
      {"version", "1.0"},
      {"added_tokens", {special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")}},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", meta}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", meta}}}}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"pair", json::array()},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", meta}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", "<unk>"},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", jm}}}};
  return j.dump(1);
}

}  // namespace inferlab
