#pragma once
/// @file model.h
/// @brief Every architecture the chapters teach behind one interface, and the one loader.
///
/// A Model is what the engine (chapter 11), the paged pool (chapter 12) and the server (chapter
/// 13) need of an architecture, whatever it is:
///
/// - its vocabulary, context, device and stop tokens;
/// - the batch step, forward(): every sequence's new tokens (prefill chunks and decode rows
///   together) through the model, each sequence's cache advancing (common/models/kv_cache.h);
/// - what each layer keeps per sequence between steps, layers(): the cache spec a cache manager
///   allocates by (below);
/// - a cache for one sequence of the simple kind (make_cache(): contiguous rows, rings, a state),
///   which the engine's contiguous pool and run_alone() use;
/// - the bytes a step reads (weights once, every sequence's cache), for the roofline.
///
/// It is an abstract class rather than a variant: the families live in their own headers
/// (mla.h, cla.h, local.h, mamba.h) and gain layers as chapters arrive, and what the engine does
/// with a model (step it, size its caches) is the same call for all of them. as_model() wraps each
/// family's model; load_model() reads any file the project reads and picks the family from it.
///
/// # What a layer keeps (LayerKind)
///
/// | kind      | per sequence                          | grows with the sequence | families                      |
/// |-----------|---------------------------------------|-------------------------|-------------------------------|
/// | Attention | K and V rows of every position        | yes: K·H·2 a position   | Llama, Qwen, Mistral, Gemma's global layers, CLA's storing layers |
/// | Window    | K and V of the last W (+ sinks) positions, a ring | no: bounded by W | Mistral's and Gemma's local layers, StreamingLLM |
/// | Latent    | one latent row of every position      | yes: r + dr a position  | DeepSeek-V2/V3 (MLA)          |
/// | Shared    | nothing: reads another layer's rows   | no                      | CLA's sharing layers          |
/// | Recurrent | a fixed state (conv inputs, SSM state)| no: constant            | Mamba                          |
///
/// Chapter 08's diffusion model is not here: it denoises a whole block of positions at once,
/// bidirectionally, so there is no next token whose cache grows, and no step the engine's
/// scheduler could batch with the others' (its loader is chapter 08's, over the same tensor
/// reader).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/models/kv_cache.h"
#include "common/ops.h"
#include "common/tokenizer.h"

namespace inferlab::models {

namespace mla {
struct MlaModel;
enum class MlaPath;
}  // namespace mla
namespace cla {
struct ClaModel;
}
namespace local {
struct LocalModel;
}
namespace mamba {
struct MambaModel;
}

enum class LayerKind { Attention, Window, Latent, Shared, Recurrent };
const char* layer_kind_name(LayerKind k);

/// What one layer keeps per sequence: the spec a cache manager allocates by.
struct LayerSpec {
  LayerKind kind = LayerKind::Attention;
  /// Attention and Latent: the tensors one position adds, K and V [heads, head_dim] for
  /// attention, one row [1, r + dr] for a latent layer (its value is the row's first r columns).
  std::vector<Shape> rows;
  /// Window and Recurrent: what one sequence keeps whatever its length: the K and V rings
  /// [sinks + W, heads, head_dim], or a recurrent layer's state tensors.
  std::vector<Shape> fixed;
  std::int64_t window = 0, sinks = 0;  ///< Window
  std::int64_t source = -1;            ///< Shared: the layer whose rows it reads
  AttentionParams attention;           ///< scale and soft-capping of the attention layers (Gemma's; else defaults)

  bool grows() const { return kind == LayerKind::Attention || kind == LayerKind::Latent; }
  /// Values (f32) one position adds, and one sequence keeps whatever its length.
  std::int64_t row_values() const;
  std::int64_t fixed_values() const;
  /// Bytes a sequence of `positions` tokens keeps for this layer, f32.
  std::int64_t bytes(std::int64_t positions) const;
  /// Bytes a decode step at `length` cached positions reads of this layer's cache (a Shared layer
  /// reads its source's rows again; a Window layer at most its window).
  std::int64_t bytes_read(std::int64_t length, const std::vector<LayerSpec>& all) const;
};

class Model {
 public:
  virtual ~Model() = default;
  /// The config's architecture ("LlamaForCausalLM", "DeepseekV3ForCausalLM", "MambaForCausalLM", ...).
  virtual const std::string& architecture() const = 0;
  /// Where it was loaded from.
  virtual const std::string& source() const = 0;
  virtual std::int64_t vocab_size() const = 0;
  /// Positions a sequence may reach; none for a model without a limit (Mamba).
  virtual std::optional<std::int64_t> context() const = 0;
  virtual Device device() const = 0;
  /// The ids that end a sample (the config's EOS ids), and the BOS id where there is one.
  virtual std::vector<std::int64_t> eos_ids() const = 0;
  virtual std::optional<std::int64_t> bos_id() const = 0;
  /// Per layer, what it keeps per sequence.
  virtual const std::vector<LayerSpec>& layers() const = 0;
  /// The batch step: each sequence's new tokens continue what its cache holds (a cache made by
  /// make_cache(), or by a pool from layers()); the caches advance. Returns the logits of each
  /// sequence's last new token (all of them where all_logits is set), sequence after sequence.
  /// `path` chooses how attention layers read the caches (kv_cache.h; ignored by others).
  virtual Tensor forward(std::vector<SequenceStep>& seqs, AttendPath path = AttendPath::Batched) const = 0;
  /// A cache for one sequence of up to `capacity` positions, of the family's simple kind.
  virtual std::unique_ptr<Cache> make_cache(std::int64_t capacity) const = 0;
  /// A cache of only the layers that keep a fixed amount per sequence (the Window layers' rings,
  /// the Recurrent layers' state), for a pool that keeps the growing layers' rows itself (chapter
  /// 12's paged pool): its other layers keep nothing. Null when every layer grows or shares.
  virtual std::unique_ptr<Cache> make_fixed_cache() const { return nullptr; }
  /// Bytes of weights one decode step reads.
  virtual std::int64_t step_weight_bytes() const = 0;
  /// The Llama-family decoder underneath, where the model is one (plain, windowed or shared
  /// caches), for code that runs only that (chapter 02's CUDA decoder); null otherwise.
  virtual const Llama* llama() const { return nullptr; }

  /// The fewest bytes a batch step at these cache lengths reads: the weights once, and each
  /// sequence's cache in every layer (common/decode_bench.h's roofline).
  double step_bytes(const std::vector<std::int64_t>& lengths) const;
  /// Bytes one sequence of `positions` tokens keeps, all layers.
  std::int64_t cache_bytes(std::int64_t positions) const;
  /// "4 layers: 3 window (W = 64), 1 attention"
  std::string describe_layers() const;
};

/// The layers of a Llama-family config, every one full attention with the config's scale and
/// soft-capping.
std::vector<LayerSpec> attention_layers(const TransformerConfig& c);

/// Each family's model behind the interface (the model is moved in; tensors share their storage).
std::unique_ptr<Model> as_model(Llama m);
std::unique_ptr<Model> as_model(local::LocalModel m);
std::unique_ptr<Model> as_model(mla::MlaModel m);  ///< the absorbed path (mla.h)
std::unique_ptr<Model> as_model(mla::MlaModel m, mla::MlaPath path);
std::unique_ptr<Model> as_model(cla::ClaModel m);
std::unique_ptr<Model> as_model(mamba::MambaModel m);

/// A model read from `path`, whatever it holds: a Hugging Face folder (its config.json's
/// architecture picks the family: Llama, Qwen2/3, Mistral and Gemma with their windows,
/// Mixtral and Qwen2-MoE, DeepSeek-V2/V3, CLA, Mamba), a GGUF file (general.architecture: llama,
/// qwen2, qwen2moe, qwen3, gemma2, gemma3, deepseek2) or a llama2.c checkpoint; on `device`
/// (a GGUF's block types run packed, on the CPU in the interleaved layout). An architecture the
/// core has no model for (chapter 08's diffusion model, a GGUF of another family) is refused,
/// naming where it runs, if anywhere.
std::unique_ptr<Model> load_model(const std::string& path, Device device = Device::CPU);

/// The tokenizer that goes with a model file (`explicit_path` when given): a GGUF's own, else
/// the folder's or the one beside the file (Tokenizer::for_model); checked against the model's
/// vocabulary.
std::unique_ptr<Tokenizer> load_model_tokenizer(const Model& m, const std::string& explicit_path = "");

/// The ids that end a sample of a model file: its config's EOS ids, and for a GGUF the
/// end-of-turn tokens it names, as llama.cpp stops.
std::vector<std::int64_t> stop_ids(const Model& m);

}  // namespace inferlab::models
