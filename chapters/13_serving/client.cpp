#include "chapters/13_serving/client.h"

#include <httplib.h>

#include <chrono>

namespace inferlab::ch13 {

using nlohmann::json;

Streamed stream(const std::string& host, int port, const std::string& path, json body, int disconnect_after) {
  body["stream"] = true;
  Streamed out;
  httplib::Client cli(host, port);
  cli.set_read_timeout(300, 0);
  const auto start = std::chrono::steady_clock::now();
  const auto since = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  std::string pending;  // bytes of an event not yet complete
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, std::size_t n, std::uint64_t, std::uint64_t) {
    out.body.append(data, n);
    pending.append(data, n);
    for (std::size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
      const std::string event = pending.substr(0, end);
      pending.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      const std::string payload = event.substr(6);
      if (payload == "[DONE]") {
        out.done = true;
        continue;
      }
      json chunk = json::parse(payload, nullptr, false);
      if (chunk.is_discarded()) continue;
      for (const json& c : chunk.value("choices", json::array())) {
        const auto i = c.value("index", std::size_t{0});
        if (out.text.size() <= i) out.text.resize(i + 1), out.finish_reason.resize(i + 1);
        std::string piece = c.contains("text") ? c.value("text", "") : c["delta"].value("content", "");
        if (!piece.empty()) {
          if (out.ttft < 0) out.ttft = since();
          out.token_times.push_back(since());
          out.text[i] += piece;
        }
        if (c["finish_reason"].is_string()) out.finish_reason[i] = c["finish_reason"].get<std::string>();
      }
      out.chunks.push_back(std::move(chunk));
    }
    return disconnect_after <= 0 || static_cast<int>(out.chunks.size()) < disconnect_after;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  cli.send(req, res, err);
  out.status = res.status > 0 ? res.status : 0;
  if (out.chunks.empty() && !res.body.empty()) out.body = res.body;  // an error answer, not a stream
  out.seconds = since();
  return out;
}

std::pair<int, json> post(const std::string& host, int port, const std::string& path, const json& body) {
  httplib::Client cli(host, port);
  cli.set_read_timeout(300, 0);
  const auto res = cli.Post(path, body.dump(), "application/json");
  if (!res) return {0, nullptr};
  return {res->status, json::parse(res->body, nullptr, false)};
}

}  // namespace inferlab::ch13
