#include "chapters/09_quantization/gguf_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <set>
#include <nlohmann/json.hpp>

#include "chapters/09_quantization/quant_impl.h"
#include "common/atomic_file.h"
#include "common/gguf_tokenizer.h"
#include "common/json_file.h"
#include "common/llama2c.h"
#include "common/models/gguf_moe.h"

namespace inferlab::ch09 {

using namespace models;

namespace {

using gguf::Value;

gguf::Type type_of(const QuantSpec& s) {
  if (s.format == Format::Q8_0) return gguf::Type::Q8_0;
  if (s.format == Format::Q4_0) return gguf::Type::Q4_0;
  fail("GGUF: format ", s.name(), " has no GGUF type here (q8_0 and q4_0 do)");
}

// The q/k rows in llama.cpp's order (adjacent pairs) for a model that rotates halves.
QMatrix for_gguf(const QMatrix& w, std::int64_t heads, bool permute) {
  QMatrix q = w.to(Device::CPU);
  if (permute) q.data = permute_rope_rows(q.data, heads, false);
  return q;
}

gguf::Output output(const std::string& name, const QMatrix& w) {
  return {name, type_of(w.spec), {w.rows, w.cols}, w.data.to(Device::CPU)};
}

gguf::Output output(const std::string& name, const Tensor& t) {
  const Tensor f = t.to(Device::CPU).to(DType::F32);
  return {name, gguf::Type::F32, f.shape(), f.view({-1}).to(DType::F32)};
}

// A plain matrix as F32, or as F16 when it is stored in 16 bits (F16 or BF16: written as F16).
gguf::Output plain_output(const std::string& name, const Tensor& w) {
  if (w.dtype() == DType::F32) return output(name, w);
  const Tensor h = w.to(Device::CPU).to(DType::F32).to(DType::F16);
  return {
      name, gguf::Type::F16, h.shape(),
      Tensor::wrap(const_cast<void*>(h.raw_data()), {static_cast<std::int64_t>(h.nbytes())}, DType::U8, Device::CPU, nullptr)
          .clone()};
}

// A projection, packed or plain; q and k rows in llama.cpp's order when `heads` > 0.
gguf::Output output(const std::string& name, const Linear& w, std::int64_t heads = 0, bool permute = false) {
  if (!w.packed) {
    Tensor t = w.weight.to(Device::CPU);
    if (heads > 0 && permute) t = permute_rope_rows(t.contiguous(), heads, false);
    return plain_output(name, t);
  }
  const QMatrix& q = qmatrix(w, "GGUF: " + name);
  return output(name, heads > 0 ? for_gguf(q, heads, permute) : q);
}

}  // namespace

namespace {
// llama.cpp's llama_ftype of a file whose matrices are all like the head.
std::uint32_t file_type(const Linear& head) {
  if (!head.packed) return head.weight.dtype() == DType::F32 ? 0 : 1;          // ALL_F32, MOSTLY_F16
  return qmatrix(head, "GGUF: the head").spec.format == Format::Q8_0 ? 7 : 2;  // MOSTLY_Q8_0, MOSTLY_Q4_0
}
}  // namespace

void save_gguf(const std::string& path, const models::Llama& m, const HfTokenizer& tok) {
  const auto& c = m.config;
  IL_CHECK(c.rope_scaling.is_null(), path, ": ", m.source, " scales its RoPE frequencies (rope_scaling ",
           c.rope_scaling.dump(), "), which this GGUF writer does not record");
  // A model with q/k/v biases is written as llama.cpp's qwen2 (the same blocks with those biases,
  // RoPE over the halves of a head, rows as trained); any other as llama, whose q and k rows
  // llama.cpp expects in adjacent-pair order.
  const bool qwen2 = m.layers.empty() ? false : m.layers[0].wq.bias.defined();
  IL_CHECK(!qwen2 || m.rope_pairing == RopePairing::HalfSplit,
           "GGUF: a model with q/k/v biases is written as qwen2, "
           "whose RoPE rotates the halves of each head; this one pairs adjacent dimensions");
  const std::string arch = c.moe ? gguf_moe_architecture(*c.moe, qwen2) : qwen2 ? "qwen2" : "llama";
  const bool permute = !qwen2 && m.rope_pairing == RopePairing::HalfSplit;
  std::vector<std::pair<std::string, Value>> meta = {
      {"general.architecture", Value::str(arch)},
      {"general.name", Value::str(m.source)},
      {"general.file_type", Value::u32(file_type(m.lm_head))},
      {arch + ".context_length", Value::u32(static_cast<std::uint32_t>(c.max_position_embeddings))},
      {arch + ".embedding_length", Value::u32(static_cast<std::uint32_t>(c.hidden_size))},
      {arch + ".block_count", Value::u32(static_cast<std::uint32_t>(c.num_layers))},
      {arch + ".feed_forward_length", Value::u32(static_cast<std::uint32_t>(c.intermediate_size))},
      {arch + ".rope.dimension_count", Value::u32(static_cast<std::uint32_t>(c.head_dim))},
      {arch + ".attention.head_count", Value::u32(static_cast<std::uint32_t>(c.num_heads))},
      {arch + ".attention.head_count_kv", Value::u32(static_cast<std::uint32_t>(c.num_kv_heads))},
      {arch + ".attention.layer_norm_rms_epsilon", Value::f32(static_cast<float>(c.rms_norm_eps))},
      {arch + ".rope.freq_base", Value::f32(static_cast<float>(c.rope_theta))},
  };
  if (c.moe)
    for (auto& kv : gguf_moe_metadata(*c.moe, arch)) meta.push_back(std::move(kv));
  // The tokenizer, as llama.cpp reads it: tokens, types, merges or scores, the pre-tokenizer's
  // name, BOS (common/gguf_tokenizer.h).
  for (auto& kv : gguf::tokenizer_metadata(load_json(tok.path()), tok.path(), c.vocab_size)) meta.push_back(std::move(kv));
  const bool has_bos =
      std::any_of(meta.begin(), meta.end(), [](const auto& kv) { return kv.first == "tokenizer.ggml.bos_token_id"; });
  if (c.bos_token_id && !has_bos)
    meta.emplace_back("tokenizer.ggml.bos_token_id", Value::u32(static_cast<std::uint32_t>(*c.bos_token_id)));
  if (!c.eos_token_ids.empty())
    meta.emplace_back("tokenizer.ggml.eos_token_id", Value::u32(static_cast<std::uint32_t>(c.eos_token_ids[0])));

  std::vector<gguf::Output> ts = {output("token_embd.weight", m.embed)};
  for (std::size_t i = 0; i < m.layers.size(); ++i) {
    const auto& l = m.layers[i];
    const std::string b = "blk." + std::to_string(i) + ".";
    IL_CHECK(l.wq.bias.defined() == qwen2 && l.wk.bias.defined() == qwen2 && l.wv.bias.defined() == qwen2 &&
                 !l.wo.bias.defined() && !l.w_gate.bias.defined() && !l.w_up.bias.defined() && !l.w_down.bias.defined(),
             "GGUF: layer ", i, " has biases other than on all of q, k and v (llama and qwen2 have none elsewhere)");
    ts.push_back(output(b + "attn_norm.weight", l.attn_norm));
    ts.push_back(output(b + "attn_q.weight", l.wq, c.num_heads, permute));
    ts.push_back(output(b + "attn_k.weight", l.wk, c.num_kv_heads, permute));
    ts.push_back(output(b + "attn_v.weight", l.wv));
    if (qwen2)
      for (const auto& [n, w] :
           {std::pair{"attn_q.bias", &l.wq}, std::pair{"attn_k.bias", &l.wk}, std::pair{"attn_v.bias", &l.wv}})
        ts.push_back(output(b + n, w->bias));
    ts.push_back(output(b + "attn_output.weight", l.wo));
    ts.push_back(output(b + "ffn_norm.weight", l.mlp_norm));
    if (l.moe.defined()) {  // llama.cpp's layout: the router in F32, each matrix's experts stacked
      const MoeFfn& f = l.moe;
      ts.push_back(output(b + "ffn_gate_inp.weight", f.router.to(Device::CPU, DType::F32).weight));
      for (const auto& [n, pick] :
           {std::pair{"gate", &Expert::gate}, std::pair{"up", &Expert::up}, std::pair{"down", &Expert::down}}) {
        std::vector<gguf::Output> parts;
        for (const Expert& e : f.experts) parts.push_back(output(b + "ffn_" + n + "_exps.weight", e.*pick));
        ts.push_back(stack_experts(b + "ffn_" + n + "_exps.weight", parts));
        if (f.shared.defined()) ts.push_back(output(b + "ffn_" + n + "_shexp.weight", f.shared.*pick));
      }
      if (f.shared_gate.defined())
        ts.push_back(output(b + "ffn_gate_inp_shexp.weight", f.shared_gate.to(Device::CPU, DType::F32).weight));
      continue;
    }
    ts.push_back(output(b + "ffn_gate.weight", l.w_gate));
    ts.push_back(output(b + "ffn_up.weight", l.w_up));
    ts.push_back(output(b + "ffn_down.weight", l.w_down));
  }
  ts.push_back(output("output_norm.weight", m.final_norm));
  ts.push_back(output("output.weight", m.lm_head));  // written even when tied: llama.cpp then uses it
  gguf::write(path, meta, ts);
}

namespace {
// The GGUF carries the model folder's tokenizer.json: a model file (a llama2.c .bin) has none, and
// its bytes used to be parsed as one.
void check_exportable(const std::string& model) {
  IL_CHECK(std::filesystem::is_directory(model), "--model ", model,
           ": export takes a Hugging Face model folder, whose tokenizer.json goes into the GGUF (a llama2.c "
           "checkpoint becomes one with `ch01_naive_decode convert ",
           model, " <folder> --to hf`)");
}
}  // namespace

void export_gguf(const std::string& model, const QuantSpec& spec, const std::string& out) {
  check_exportable(model);
  check_not_input(out, {model});  // before the work, and before the rename would replace the model
  require_writable_file(out, "GGUF");
  const models::Llama m = models::load_llama(model).to(Device::CPU, DType::F32);
  save_gguf(out, quantize_model(m, spec), HfTokenizer::load(model));
}

void export_gguf(const std::string& model, DType plain, const std::string& out) {
  IL_CHECK(plain == DType::F32 || plain == DType::F16, "export: plain matrices are written as f32 or f16, not ",
           dtype_name(plain));
  check_exportable(model);
  check_not_input(out, {model});
  require_writable_file(out, "GGUF");
  save_gguf(out, models::load_llama(model).to(Device::CPU, plain), HfTokenizer::load(model));
}

}  // namespace inferlab::ch09
