#pragma once
/// @file eval.h
/// @brief Model quality the way the model zoo measures it: validation perplexity and probes.
///
/// The same protocol as tools/evaluate.py, so numbers from the C++ side (a converted or
/// quantised model) sit beside the model cards' numbers: each line of the validation text is a
/// document, encoded with its special tokens (BOS first) and packed; the stream is cut into
/// non-overlapping windows of `window` + 1 tokens; the loss is the mean next-token cross-entropy
/// in nats. A probe is right when, teacher-forced, the argmax at every answer position is the
/// answer's token (what greedy decoding would produce).

#include <functional>
#include <map>
#include <string>
#include <vector>
#include <nlohmann/json_fwd.hpp>

#include "common/tensor.h"
#include "common/tokenizer.h"

namespace inferlab::eval {

/// Logits [T, V] at every position of a token sequence (any device).
using LogitsFn = std::function<Tensor(const std::vector<std::int32_t>&)>;

struct Perplexity {
  double loss = 0;  ///< mean cross-entropy, nats per token
  double ppl = 0;   ///< exp(loss)
  std::int64_t tokens = 0;
};

/// Each non-empty line of `path` encoded with special tokens, concatenated.
std::vector<std::int32_t> tokenize_documents(const Tokenizer& tok, const std::string& path);

/// The first `n` tokens of `data_dir`/corpus/val.txt with the zoo's tokenizer: a real sequence for
/// a chapter to perturb or time. Throws when the text is shorter.
std::vector<std::int32_t> validation_tokens(const std::string& data_dir, std::int64_t n);

/// Mean next-token cross-entropy over windows of window + 1 tokens (max_windows = 0: all).
/// Throws "<what>: window w, position t: the logits hold NaN or infinity", or for a perplexity
/// that overflows, rather than return one that is not a number (weights too large for their
/// format overflow to infinity). `what` (the model, say) also labels the progress line.
Perplexity perplexity(const LogitsFn& logits, const std::vector<std::int32_t>& tokens, std::int64_t window,
                      std::int64_t max_windows = 0, const std::string& what = "perplexity");

struct Probe {
  std::string kind, prompt, answer, distractor;
};

/// Reads data/corpus/probes.jsonl (fields: kind, prompt, answer, and distractor for recall).
std::vector<Probe> load_probes(const std::string& path);

struct ProbeScores {
  std::map<std::string, double> accuracy;    ///< per kind
  std::map<std::string, double> distractor;  ///< how often the first answer token was the distractor's
  std::int64_t per_kind = 0;
};

/// The kinds of `scores`, in reading order for a table's columns: recall by distance, then
/// associative recall by pairs ("recall_32", "recall_400", "ar_4", "ar_64"), not by spelling
/// ("ar_16" before "ar_4"); a kind without a number after its family's numbered ones, other
/// families last.
std::vector<std::string> kinds_in_reading_order(const std::map<std::string, double>& scores);

/// Probe accuracy, using at most `per_kind` probes of each kind (0: all); `what` (the model, say)
/// labels the progress line.
ProbeScores probe_accuracy(const LogitsFn& logits, const Tokenizer& tok, const std::vector<Probe>& probes,
                           std::int64_t per_kind = 0, const std::string& what = "probes");
/// A model's answer to a probe: from the prompt's ids and the answer's (tokenized as the prompt's
/// continuation), the ids it puts at the answer's positions. probe_accuracy's is teacher-forced
/// argmax; a model that cannot be teacher-forced (a bidirectional one, which would see the answer)
/// generates them instead.
using AnswerFn = std::function<std::vector<std::int32_t>(const std::vector<std::int32_t>& prompt,
                                                         const std::vector<std::int32_t>& answer)>;
/// probe_accuracy with the model's answers from `answer`.
ProbeScores probe_accuracy_of_answers(const AnswerFn& answer, const Tokenizer& tok, const std::vector<Probe>& probes,
                                      std::int64_t per_kind = 0, const std::string& what = "probes");

/// A model as a quality table sees it: a name, the bytes its cache keeps per token, its logits.
struct Scored {
  std::string name;
  std::int64_t cache_bytes_per_token = 0;
  LogitsFn logits;
};

/// The chapters' quality table, on the zoo's data (`data_dir`/corpus, the zoo's tokenizer):
/// validation perplexity over `windows` windows of 512 (0: all) and probe accuracy (`per_kind`
/// probes of each kind, 0: all) of every model, one printed row each as it is measured. Returns
/// the rows as JSON (model, cache bytes per token, loss, perplexity, tokens, probes).
nlohmann::json quality_table(const std::vector<Scored>& models, const std::string& data_dir, std::int64_t windows,
                             std::int64_t per_kind);

}  // namespace inferlab::eval
