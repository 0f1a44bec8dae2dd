// Chapter 13: the OpenAI request reader (every field a client can get wrong is a 400 naming it),
// the answer and chunk shapes, server-sent event framing, the text a sample releases as its
// tokens arrive (cut exactly at a stop string, never sending what a later token takes back), and
// the Prometheus text.
#include <gtest/gtest.h>

#include "chapters/13_serving/openai.h"
#include "chapters/13_serving/output_text.h"
#include "chapters/13_serving/prometheus.h"
#include "common/error.h"
#include "common/tokenizer.h"

using namespace inferlab;
using namespace inferlab::ch13;
using nlohmann::json;

namespace {

// The ApiError parse_completion throws for `body`, or a failure when it throws none.
ApiError refusal(const std::string& body, bool chat = false) {
  try {
    parse_completion(body, chat);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << body;
  return ApiError(0, "");
}

const Tokenizer& tiny_tokenizer() {
  static const auto tok = Tokenizer::load(std::string(INFERLAB_DATA_DIR) + "/models/tiny-mha");
  return *tok;
}

}  // namespace

TEST(OpenAiRequest, ReadsWhatClientsSend) {
  const CompletionParams p = parse_completion(
      R"({"model": "tiny-mha", "prompt": "Once", "max_tokens": 5, "temperature": 0, "top_p": 0.5, "seed": 3,
          "stop": ["\n", "The"], "n": 2, "stream": true, "stream_options": {"include_usage": true},
          "user": "ignored", "frequency_penalty": 0, "logprobs": null})",
      false);
  EXPECT_EQ(p.model, "tiny-mha");
  EXPECT_EQ(p.prompt_text, "Once");
  EXPECT_EQ(p.max_tokens, 5);
  EXPECT_EQ(p.temperature, 0);
  EXPECT_EQ(p.top_p, 0.5);
  EXPECT_EQ(p.seed, 3u);
  EXPECT_EQ(p.stop, (std::vector<std::string>{"\n", "The"}));
  EXPECT_EQ(p.n, 2);
  EXPECT_TRUE(p.stream);
  EXPECT_TRUE(p.include_usage);
  // The prompt's other forms: a list of one string, token ids, a list of one list of ids.
  EXPECT_EQ(parse_completion(R"({"prompt": ["Once"]})", false).prompt_text, "Once");
  EXPECT_EQ(parse_completion(R"({"prompt": [1, 2, 3]})", false).prompt_ids, (std::vector<std::int32_t>{1, 2, 3}));
  EXPECT_EQ(parse_completion(R"({"prompt": [[4, 5]]})", false).prompt_ids, (std::vector<std::int32_t>{4, 5}));
  // Defaults: OpenAI's temperature 1, one sample, no stream; max_tokens left to the server.
  const CompletionParams d = parse_completion(R"({"prompt": "x", "stop": "END"})", false);
  EXPECT_EQ(d.temperature, 1.0);
  EXPECT_EQ(d.n, 1);
  EXPECT_FALSE(d.stream);
  EXPECT_FALSE(d.max_tokens);
  EXPECT_EQ(d.stop, std::vector<std::string>{"END"});
  // Chat: messages, with content as a string or as text parts; max_completion_tokens too.
  const CompletionParams c = parse_completion(
      R"({"messages": [{"role": "system", "content": "Be brief."},
                       {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}],
          "max_completion_tokens": 7})",
      true);
  ASSERT_EQ(c.messages.size(), 2u);
  EXPECT_EQ(c.messages[1].role, "user");
  EXPECT_EQ(c.messages[1].content, "Hi there");
  EXPECT_EQ(c.max_tokens, 7);
}

TEST(OpenAiRequest, EveryMistakeIsA400NamingTheField) {
  struct Case {
    const char* body;
    bool chat;
    const char* param;
    const char* says;
  };
  const Case cases[] = {
      {"{\"prompt\": \"x\"", false, "", "not valid JSON"},
      // a number beyond a double: the JSON library's out_of_range, which used to escape as a 500
      {R"({"prompt": "x", "temperature": 600e23860344})", false, "", "not valid JSON"},
      {"[1, 2]", false, "", "must be a JSON object"},
      {"{}", false, "prompt", "'prompt' is required"},
      {R"({"prompt": ""})", false, "prompt", "empty"},
      {R"({"prompt": 5})", false, "prompt", "must be a string"},
      {R"({"prompt": ["a", "b"]})", false, "prompt", "one prompt per request"},
      {R"({"prompt": [1, -2]})", false, "prompt", "must be in"},
      {R"({"prompt": "x", "max_tokens": 0})", false, "max_tokens", "must be in [1,"},
      {R"({"prompt": "x", "max_tokens": -3})", false, "max_tokens", "must be in [1,"},
      {R"({"prompt": "x", "max_tokens": "8"})", false, "max_tokens", "must be an integer, got a string"},
      {R"({"prompt": "x", "max_tokens": 2.5})", false, "max_tokens", "must be an integer"},
      {R"({"prompt": "x", "temperature": "hot"})", false, "temperature", "must be a number"},
      {R"({"prompt": "x", "temperature": 3})", false, "temperature", "must be in [0, 2], got 3"},
      {R"({"prompt": "x", "top_p": 0})", false, "top_p", "greater than 0"},
      {R"({"prompt": "x", "n": 0})", false, "n", "must be in [1, 128]"},
      {R"({"prompt": "x", "stop": 7})", false, "stop", "a string or a list of strings"},
      {R"({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]})", false, "stop", "at most 4"},
      {R"({"prompt": "x", "stop": [""]})", false, "stop", "must not be empty"},
      {R"({"prompt": "x", "stream": "yes"})", false, "stream", "must be a boolean"},
      {R"({"prompt": "x", "stream_options": {"include_usage": true}})", false, "stream_options", "only allowed"},
      {R"({"prompt": "x", "model": 3})", false, "model", "must be a string"},
      {R"({"prompt": "x", "logprobs": 2})", false, "logprobs", "not supported"},
      {R"({"prompt": "x", "echo": true})", false, "echo", "not supported"},
      {R"({"prompt": "x", "best_of": 3})", false, "best_of", "not supported"},
      {R"({})", true, "messages", "'messages' is required"},
      {R"({"messages": []})", true, "messages", "non-empty list"},
      {R"({"messages": ["hi"]})", true, "messages[0]", "must be an object"},
      {R"({"messages": [{"content": "hi"}]})", true, "messages[0].role", "is required"},
      {R"({"messages": [{"role": "user", "content": 5}]})", true, "messages[0].content", "must be a string or a list"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", true, "messages[0].content",
       "only text parts"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "tools": []})", true, "tools", "not supported"},
  };
  for (const Case& c : cases) {
    const ApiError e = refusal(c.body, c.chat);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << c.body << " gave: " << e.what();
    const json body = error_body(e);
    EXPECT_EQ(body["error"]["type"], "invalid_request_error");
    EXPECT_EQ(body["error"]["message"], e.what());
    if (*c.param) EXPECT_EQ(body["error"]["param"], c.param);
    else EXPECT_TRUE(body["error"]["param"].is_null());
  }
}

TEST(OpenAiAnswer, ShapesOfAnswersAndChunks) {
  const AnswerHeader h{"cmpl-7", "tiny-mha", 1700000000, false};
  const json r = response(h, {{0, "Once upon", "length"}, {1, "The", "stop"}}, {5, 3});
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["choices"][0]["text"], "Once upon");
  EXPECT_EQ(r["choices"][1]["finish_reason"], "stop");
  EXPECT_EQ(r["usage"], (json{{"prompt_tokens", 5}, {"completion_tokens", 3}, {"total_tokens", 8}}));
  const json c = chunk(h, {0, " a", ""});
  EXPECT_EQ(c["choices"][0]["text"], " a");
  EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null());

  const AnswerHeader hc{"chatcmpl-7", "tiny-mha", 1700000000, true};
  const json rc = response(hc, {{0, "Hello", "stop"}}, {5, 1});
  EXPECT_EQ(rc["object"], "chat.completion");
  EXPECT_EQ(rc["choices"][0]["message"], (json{{"role", "assistant"}, {"content", "Hello"}}));
  const json first = chunk(hc, {0, "", ""}, true), piece = chunk(hc, {0, "Hel", ""}), last = chunk(hc, {0, "", "stop"});
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"], (json{{"role", "assistant"}, {"content", ""}}));
  EXPECT_EQ(piece["choices"][0]["delta"], (json{{"content", "Hel"}}));
  EXPECT_EQ(last["choices"][0]["delta"], json::object());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  const json u = usage_chunk(hc, {5, 1});
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["total_tokens"], 6);
}

// Server-sent events: each payload one "data: " line and a blank line; a JSON payload with a
// newline inside a string stays one line (dump() escapes it).
TEST(ServerSentEvents, OneDataLineAndABlankLine) {
  EXPECT_EQ(sse_event("{\"a\":1}"), "data: {\"a\":1}\n\n");
  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
  const std::string e = sse_event(json{{"text", "two\nlines"}}.dump());
  EXPECT_EQ(e.find('\n'), e.size() - 2) << e;
}

// Decoded bytes as JSON can carry them: ill-formed parts become U+FFFD (one for each longest
// broken-off start of a character, as Python's and Rust's lossy decoders do); an incomplete
// character at the end is held back while more tokens may come.
TEST(OutputTextRelease, ValidUtf8) {
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(valid_utf8("a\xC3\xA9"
                       "b \xF0\x9F\x98\x80",
                       true),
            "a\xC3\xA9"
            "b \xF0\x9F\x98\x80");
  EXPECT_EQ(valid_utf8("a\xC3", true), "a");
  EXPECT_EQ(valid_utf8("a\xC3", false), "a" + r);
  EXPECT_EQ(valid_utf8("\xF0\x9F\x98", true), "");
  EXPECT_EQ(valid_utf8("\xE2\x82"
                       "x",
                       true),
            r + "x");
  EXPECT_EQ(valid_utf8("\xFF\x80", false), r + r);
  EXPECT_EQ(valid_utf8("\xED\xA0\x80", false), r + r + r) << "a surrogate is no character";
  EXPECT_EQ(valid_utf8("\xC0\xAF", false), r + r) << "an overlong form is no character";
}

// What may be sent before the next token: all but the longest ending that begins a stop string.
TEST(OutputTextRelease, HoldsBackWhatCouldStillBecomeAStopString) {
  EXPECT_EQ(releasable("Once upon", {}), 9u);
  EXPECT_EQ(releasable("Once upon", {"\n\n"}), 9u);
  EXPECT_EQ(releasable("Once upon\n", {"\n\n"}), 9u);
  EXPECT_EQ(releasable("Once up", {"upon a"}), 5u);
  EXPECT_EQ(releasable("Once upon a", {"upon a"}), 11u) << "a stop string already whole is the caller's to find";
  EXPECT_EQ(releasable("ab", {"b", "abc"}), 0u) << "the longest of the endings";
  EXPECT_EQ(releasable("", {"x"}), 0u);
}

// The text of a sample as its tokens come one by one: what is released never changes later,
// the whole equals the decoded text, and a stop string ends it exactly before the string,
// wherever the token boundaries fall.
TEST(OutputTextRelease, CutsExactlyAtAStopStringAcrossTokens) {
  const Tokenizer& tok = tiny_tokenizer();
  const std::vector<std::int32_t> prompt = tok.encode("Once upon a time", true);
  const std::string story = " there was a little girl named Lily. She liked to play. One day, she saw a big dog.";
  const std::vector<std::int32_t> gen = tok.encode(story, false);
  ASSERT_GT(gen.size(), 10u);
  const std::string whole = tok.decode(
                                   [&] {
    std::vector<std::int32_t> all = prompt;
    all.insert(all.end(), gen.begin(), gen.end());
    return all;
                                   }(),
                                   true)
      .substr(tok.decode(prompt, true).size());
  for (const std::vector<std::string>& stop :
       {std::vector<std::string>{}, {"play."}, {"ay. On"}, {"zzz", "big"}, {"Lily", "girl"}, {"."}}) {
    OutputText out(tok, prompt, stop);
    std::vector<std::int32_t> seq = prompt;
    std::string streamed;
    for (std::size_t i = 0; i < gen.size() && !out.stopped(); ++i) {
      seq.push_back(gen[i]);
      const std::string before = out.text();
      streamed += out.update(seq, i + 1 == gen.size());
      EXPECT_EQ(out.text().compare(0, before.size(), before), 0) << "released text changed";
    }
    std::size_t cut = std::string::npos;
    for (const std::string& s : stop) cut = std::min(cut, whole.find(s));
    EXPECT_EQ(streamed, whole.substr(0, cut)) << (stop.empty() ? "" : stop[0]);
    EXPECT_EQ(out.stopped(), cut != std::string::npos);
    EXPECT_EQ(streamed, out.text());
  }
}

TEST(Prometheus, HistogramAndMetricText) {
  Histogram h({0.1, 1});
  for (double v : {0.05, 0.1, 0.5, 3.0}) h.observe(v);
  EXPECT_EQ(h.text("x_seconds", "A help."),
            "# HELP x_seconds A help.\n# TYPE x_seconds histogram\nx_seconds_bucket{le=\"0.1\"} 2\n"
            "x_seconds_bucket{le=\"1\"} 3\nx_seconds_bucket{le=\"+Inf\"} 4\nx_seconds_sum 3.65\nx_seconds_count 4\n");
  EXPECT_EQ(metric_text("y_total", "counter", "Ys.", 7), "# HELP y_total Ys.\n# TYPE y_total counter\ny_total 7\n");
  EXPECT_THROW(Histogram({1, 0.5}), Error);
}

// seed 2^63, 2^63+1 and 9.223372036854775807e18 were accepted (the range check ran in doubles,
// where INT64_MAX rounds up to 2^63), and 2^63 gave the text of INT64_MIN.
TEST(OpenAiRequest, ASeedPastInt64IsRefusedExactly) {
  for (const char* seed : {"9223372036854775808", "9223372036854775809", "9.223372036854775807e18", "1e19",
                           "18446744073709551615", "-9223372036854775809", "-9.3e18", "-9.223372036854775808e18"}) {
    const ApiError e = refusal(std::string(R"({"prompt": "x", "seed": )") + seed + "}");
    EXPECT_EQ(e.status, 400) << seed;
    EXPECT_EQ(e.param, "seed") << seed;
  }
  EXPECT_EQ(parse_completion(R"({"prompt": "x", "seed": 9223372036854775807})", false).seed,
            static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()));
  EXPECT_EQ(parse_completion(R"({"prompt": "x", "seed": -9223372036854775808})", false).seed,
            static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::min()));
  EXPECT_EQ(parse_completion(R"({"prompt": "x", "seed": 9007199254740992.0})", false).seed, 9007199254740992u)
      << "a float is taken up to 2^53, where it is still exact";
  EXPECT_EQ(parse_completion(R"({"prompt": "x", "seed": 4.0})", false).seed, 4u);
}

// 8 MB of '[' was parsed 8 million levels deep (+560 MB a request) before it was refused: the
// nesting is counted first, over the text, and nothing is built.
TEST(OpenAiRequest, JsonNestedPastTheLimitIsRefusedBeforeItIsParsed) {
  const ApiError deep = refusal(std::string(8 << 20, '['));
  EXPECT_EQ(deep.status, 400);
  EXPECT_NE(std::string(deep.what()).find("deeper than 64 levels"), std::string::npos) << deep.what();
  std::string ok = R"({"prompt": "x", "user": )", bad = ok;
  for (int i = 0; i < 62; ++i) ok += "[";
  for (int i = 0; i < 62; ++i) ok += "]";
  ok += "}";  // 63 levels with the body's object
  EXPECT_NO_THROW(parse_completion(ok, false));
  for (int i = 0; i < 64; ++i) bad += "[";
  EXPECT_EQ(refusal(bad + "]}").status, 400);
  // Brackets inside strings are text, escaped quotes included.
  EXPECT_NO_THROW(parse_completion(R"({"prompt": "[[[[\"[[[[)" + std::string(100, '[') + R"("})", false));
  EXPECT_EQ(json_depth(R"({"a": "\\", "b": [[1]]})", 64), 3u);
  EXPECT_EQ(json_depth(std::string(1000, '{'), 10), 11u) << "counting stops past the limit";
}

// A field that would change the answer and is not implemented is refused by name (until the
// sampler has it); the value that changes nothing is accepted.
TEST(OpenAiRequest, UnimplementedSamplingFieldsAreRefusedUnlessTheyChangeNothing) {
  for (const char* f : {R"("presence_penalty": 0.5)", R"("frequency_penalty": -1)", R"("repetition_penalty": 1.2)",
                        R"("min_p": 0.05)", R"("logit_bias": {"50256": -100})"}) {
    const ApiError e = refusal(std::string(R"({"prompt": "x", )") + f + "}");
    EXPECT_EQ(e.status, 400) << f;
    EXPECT_NE(std::string(e.what()).find("not supported by this server"), std::string::npos) << e.what();
    EXPECT_FALSE(e.param.empty()) << f;
  }
  EXPECT_NO_THROW(parse_completion(
      R"({"prompt": "x", "presence_penalty": 0, "frequency_penalty": 0.0, "repetition_penalty": 1, "min_p": 0,
          "logit_bias": {}})",
      false));
  EXPECT_EQ(refusal(R"({"prompt": "x", "min_p": "a lot"})").param, "min_p");
}

// An assistant message with tool_calls and a tool message were flattened to their text.
TEST(OpenAiRequest, ToolCallsAndToolMessagesAreRefusedNotFlattened) {
  const ApiError call = refusal(
      R"({"messages": [{"role": "user", "content": "weather?"},
          {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
           "function": {"name": "get_weather", "arguments": "{}"}}]}]})",
      true);
  EXPECT_EQ(call.param, "messages[1].tool_calls");
  const ApiError tool = refusal(R"({"messages": [{"role": "tool", "tool_call_id": "c1", "content": "sunny"}]})", true);
  EXPECT_EQ(tool.param, "messages[0].role");
  EXPECT_EQ(refusal(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "auto"})", true).param,
            "tool_choice");
  EXPECT_NO_THROW(parse_completion(R"({"messages": [{"role": "assistant", "content": "x", "tool_calls": []}]})", true));
}
