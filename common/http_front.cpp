#include "common/http_front.h"

#include <fcntl.h>
#include <malloc.h>
#include <netdb.h>
#include <poll.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace inferlab::http {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

bool ci_equal(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

// RFC 9110's tchar: the characters of a method and of a header name.
bool is_tchar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("!#$%&'*+-.^_`|~", c) != nullptr; }

bool is_token(std::string_view s) { return !s.empty() && std::all_of(s.begin(), s.end(), is_tchar); }

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// A value quoted in an error message: printable ASCII, at most 40 characters.
std::string quoted(std::string_view s) {
  std::string out = "'";
  for (char c : s.substr(0, 40)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return out + (s.size() > 40 ? "…'" : "'");
}

const char* status_text(int status) {
  switch (status) {
    case 100: return "Continue";
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
  }
}

std::string mib(std::size_t bytes) {
  std::ostringstream s;
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) s << bytes / (1u << 20) << " MiB";
  else if (bytes >= 1024 && bytes % 1024 == 0) s << bytes / 1024 << " KiB";
  else s << bytes << " bytes";
  return s.str();
}

// "2.5 s"
std::string secs(double s) {
  std::ostringstream o;
  o << s << " s";
  return o.str();
}

void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK); }

// What one request's handler can reach from its thread (client_gone, note) and what the access
// log takes from cpp-httplib's logger.
struct RequestContext {
  int fd = -1;
  int status = 0;
  std::string reason;  // a 5xx's error message
  std::vector<std::pair<std::string, std::int64_t>> notes;
};
thread_local RequestContext* t_request = nullptr;

// The error message of an OpenAI-style error body, else the body itself (cut short).
std::string reason_of(const std::string& body) {
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
      j["error"]["message"].is_string())
    return j["error"]["message"].get<std::string>();
  return body.substr(0, 300);
}

// cpp-httplib's accept loop gives each connection to its task queue; this one hands it over at
// once (process_and_close_socket only queues it for the event loop), and on the accept loop's
// idle beat stops it when the front is stopping.
class HandOver final : public httplib::TaskQueue {
 public:
  explicit HandOver(std::function<void()> on_idle) : idle_(std::move(on_idle)) {}
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override {}
  void on_idle() override { idle_(); }

 private:
  std::function<void()> idle_;
};

}  // namespace

void Limits::validate() const {
  auto in = [](const char* name, double v, double lo, double hi) {
    IL_CHECK(v >= lo && v <= hi, "HTTP limit ", name, " must be in [", lo, ", ", hi, "], got ", v);
  };
  in("max_headers", static_cast<double>(max_headers), 1, 1e5);
  in("max_head_bytes", static_cast<double>(max_head_bytes), 1024, 64 << 20);
  in("max_body_bytes", static_cast<double>(max_body_bytes), 1, 1ull << 32);
  in("max_receiving_bytes", static_cast<double>(max_receiving_bytes), static_cast<double>(max_body_bytes), 1ull << 40);
  in("max_connections", static_cast<double>(max_connections), 1, 1 << 20);
  in("header_timeout_s", header_timeout_s, 0.01, 3600);
  in("body_timeout_s", body_timeout_s, 0.01, 3600);
  in("keep_alive_timeout_s", keep_alive_timeout_s, 0.01, 3600);
  in("keep_alive_requests", static_cast<double>(keep_alive_requests), 1, 1e9);
  in("write_timeout_s", write_timeout_s, 0.01, 3600);
  in("workers", static_cast<double>(workers), 1, 1 << 16);
  in("linger_s", linger_s, 0, 60);
}

LogFormat parse_log_format(const std::string& s) {
  if (s == "text") return LogFormat::Text;
  if (s == "json") return LogFormat::Json;
  if (s == "none") return LogFormat::None;
  fail("log format must be text, json or none, got '", s, "'");
}

std::string url(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos;
  return "http://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

// --- RequestReader ----------------------------------------------------------------------------

RequestReader::State RequestReader::refuse(int status, std::string why) {
  status_ = status;
  reason_ = std::move(why);
  return state_ = State::Refused;
}

RequestReader::State RequestReader::feed(std::string_view bytes) {
  if (state_ == State::Refused) return state_;
  in_.append(bytes);
  if (state_ == State::Complete) return state_;
  if (!head_done_) {
    const State s = parse_head();
    if (s != State::NeedMore || !head_done_) return state_ = s;
  }
  return state_ = parse_body();
}

RequestReader::State RequestReader::parse_head() {
  // The head ends at the first empty line; every line ends with CRLF.
  const std::size_t from = scan_ >= 3 ? scan_ - 3 : 0;
  const std::size_t end = in_.find("\r\n\r\n", from);
  if (end == std::string::npos) {
    scan_ = in_.size();
    // Still coming: refuse as soon as what came already breaks a limit.
    const std::size_t first_nl = in_.find('\n');
    if (first_nl == std::string::npos || first_nl + 1 > limits_.max_request_line) {
      if (std::min(first_nl == std::string::npos ? in_.size() : first_nl + 1, in_.size()) > limits_.max_request_line)
        return refuse(414, "the request line is longer than " + mib(limits_.max_request_line));
      return State::NeedMore;
    }
    const std::size_t last_nl = in_.rfind('\n');
    if (in_.size() - (last_nl + 1) > limits_.max_header_line)
      return refuse(431, "a header line is longer than " + mib(limits_.max_header_line));
    if (in_.size() > limits_.max_head_bytes)
      return refuse(431, "the request head (request line and headers) is larger than " + mib(limits_.max_head_bytes));
    if (static_cast<std::size_t>(std::count(in_.begin(), in_.end(), '\n')) > limits_.max_headers + 1)
      return refuse(431, "the request has more than " + std::to_string(limits_.max_headers) + " header lines");
    return State::NeedMore;
  }
  if (end + 4 > limits_.max_head_bytes)
    return refuse(431, "the request head (request line and headers) is larger than " + mib(limits_.max_head_bytes));

  std::vector<std::string_view> lines;
  const std::string_view head(in_.data(), end);
  for (std::size_t at = 0;;) {
    const std::size_t crlf = head.find("\r\n", at);
    lines.push_back(head.substr(at, crlf == std::string_view::npos ? std::string_view::npos : crlf - at));
    if (crlf == std::string_view::npos) break;
    at = crlf + 2;
  }
  for (std::string_view l : lines) {
    if (l.find_first_of(std::string_view("\r\n\0", 3)) != std::string_view::npos)
      return refuse(400, "a line of the request head holds a bare CR, LF or NUL (every line must end with CRLF)");
  }

  // The request line: METHOD SP TARGET SP HTTP/1.x
  const std::string_view request_line = lines[0];
  if (request_line.size() + 2 > limits_.max_request_line)
    return refuse(414, "the request line is longer than " + mib(limits_.max_request_line));
  const std::size_t sp1 = request_line.find(' '), sp2 = request_line.find(' ', sp1 == std::string_view::npos ? 0 : sp1 + 1);
  if (sp1 == std::string_view::npos || sp2 == std::string_view::npos ||
      request_line.find(' ', sp2 + 1) != std::string_view::npos)
    return refuse(400, "the request line must be 'METHOD TARGET HTTP/1.1', got " + quoted(request_line));
  const std::string_view method = request_line.substr(0, sp1), target = request_line.substr(sp1 + 1, sp2 - sp1 - 1),
                         version = request_line.substr(sp2 + 1);
  if (!is_token(method)) return refuse(400, "the request method " + quoted(method) + " is not a token");
  if (target.empty() ||
      std::any_of(target.begin(), target.end(), [](char c) { return static_cast<unsigned char>(c) <= 0x20 || c == 0x7f; }))
    return refuse(400, "the request target " + quoted(target) + " is empty or holds a control character");
  if (version != "HTTP/1.1" && version != "HTTP/1.0") {
    if (version.substr(0, 5) == "HTTP/")
      return refuse(505, "HTTP version " + quoted(version) + " is not supported (HTTP/1.1 and HTTP/1.0 are)");
    return refuse(400, "the request line must end with the HTTP version, got " + quoted(version));
  }
  method_ = std::string(method);
  target_ = std::string(target);
  if (lines.size() - 1 > limits_.max_headers)
    return refuse(431, "the request has " + std::to_string(lines.size() - 1) + " header lines; at most " +
                           std::to_string(limits_.max_headers) + " are read");

  // The headers: the framing ones are read here, the others passed on as they came.
  std::string normalised(request_line);
  std::optional<std::uint64_t> length;
  std::vector<std::string_view> encodings;
  std::optional<std::string_view> expect;
  for (std::size_t i = 1; i < lines.size(); ++i) {
    const std::string_view l = lines[i];
    if (l.size() + 2 > limits_.max_header_line)
      return refuse(431, "a header line is longer than " + mib(limits_.max_header_line));
    if (l.front() == ' ' || l.front() == '\t')
      return refuse(400, "a header line starts with whitespace (obsolete line folding is not accepted)");
    const std::size_t colon = l.find(':');
    if (colon == std::string_view::npos || !is_token(l.substr(0, colon)))
      return refuse(400, "malformed header line " + quoted(l) + " (expected 'Name: value')");
    const std::string_view name = l.substr(0, colon), value = trim_ows(l.substr(colon + 1));
    if (std::any_of(value.begin(), value.end(),
                    [](char c) { return (static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f; }))
      return refuse(400, "header " + quoted(name) + " holds a control character");
    if (ci_equal(name, "Content-Length")) {
      if (value.empty() || value.size() > 19 ||
          !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return refuse(400, "invalid Content-Length " + quoted(value) + " (it must be a number of bytes)");
      const std::uint64_t v = std::stoull(std::string(value));
      if (length && *length != v) return refuse(400, "the request has two different Content-Length headers");
      length = v;
      continue;
    }
    if (ci_equal(name, "Transfer-Encoding")) {
      encodings.push_back(value);
      continue;
    }
    if (ci_equal(name, "Expect")) {
      expect = value;
      continue;
    }
    if (ci_equal(name, "Content-Encoding") && !ci_equal(value, "identity"))
      return refuse(415, "Content-Encoding " + quoted(value) + " is not accepted; send the body uncompressed");
    normalised += "\r\n";
    normalised += l;
  }
  if (!encodings.empty()) {
    if (length) return refuse(400, "the request has both Content-Length and Transfer-Encoding");
    if (version == "HTTP/1.0") return refuse(400, "Transfer-Encoding is not defined for HTTP/1.0");
    if (encodings.size() != 1 || !ci_equal(encodings[0], "chunked"))
      return refuse(501, "Transfer-Encoding " + quoted(encodings.size() == 1 ? encodings[0] : "(several)") +
                             " is not supported (only chunked)");
    chunked_ = true;
  }
  length_ = length.value_or(0);
  if (length_ > limits_.max_body_bytes)
    return refuse(413, "the request body is " + std::to_string(length_) + " bytes; this server takes at most " +
                           mib(limits_.max_body_bytes));
  if (expect) {
    if (!ci_equal(*expect, "100-continue")) return refuse(417, "Expect " + quoted(*expect) + " is not supported");
    continue_ = chunked_ || length_ > 0;
  }
  keep_body_ = method == "POST" || method == "PUT" || method == "PATCH" || method == "DELETE" || method == "PRI";
  head_ = std::move(normalised);
  head_has_length_ = length.has_value() || chunked_;
  in_.erase(0, end + 4);
  scan_ = 0;
  head_done_ = true;
  chunk_ = Chunk::Size;
  return State::NeedMore;
}

RequestReader::State RequestReader::parse_body() {
  if (!chunked_) {
    const std::size_t take = static_cast<std::size_t>(std::min<std::uint64_t>(length_ - body_.size(), in_.size()));
    body_.append(in_, 0, take);
    in_.erase(0, take);
    return body_.size() == length_ ? State::Complete : State::NeedMore;
  }
  constexpr std::size_t kMaxSizeLine = 1024;
  for (;;) {
    switch (chunk_) {
      case Chunk::Size: {
        const std::size_t crlf = in_.find("\r\n");
        if (crlf == std::string::npos) {
          if (in_.size() > kMaxSizeLine) return refuse(400, "a chunk-size line is longer than 1 KiB");
          return State::NeedMore;
        }
        const std::string_view line(in_.data(), crlf);
        std::size_t digits = 0;
        std::uint64_t size = 0;
        while (digits < line.size() && std::isxdigit(static_cast<unsigned char>(line[digits]))) {
          if (digits == 15) return refuse(400, "a chunk size has more than 15 hex digits");
          const char c = line[digits++];
          size = size * 16 + static_cast<std::uint64_t>(
                                 std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : std::tolower(c) - 'a' + 10);
        }
        const std::string_view rest = trim_ows(line.substr(digits));
        if (digits == 0 || (!rest.empty() && rest.front() != ';'))
          return refuse(400, "invalid chunk-size line " + quoted(line));
        if (size > limits_.max_body_bytes - body_.size())
          return refuse(413,
                        "the chunked request body passes " + mib(limits_.max_body_bytes) + ", the most this server takes");
        in_.erase(0, crlf + 2);
        if (size == 0) {
          chunk_ = Chunk::Trailer;
        } else {
          chunk_left_ = size;
          chunk_ = Chunk::Data;
        }
        break;
      }
      case Chunk::Data: {
        const std::size_t take = static_cast<std::size_t>(std::min<std::uint64_t>(chunk_left_, in_.size()));
        body_.append(in_, 0, take);
        in_.erase(0, take);
        chunk_left_ -= take;
        if (chunk_left_ > 0) return State::NeedMore;
        chunk_ = Chunk::DataEnd;
        break;
      }
      case Chunk::DataEnd:
        if (in_.size() < 2) return State::NeedMore;
        if (in_.compare(0, 2, "\r\n") != 0) return refuse(400, "a chunk's data is not followed by CRLF");
        in_.erase(0, 2);
        chunk_ = Chunk::Size;
        break;
      case Chunk::Trailer:
        if (in_.size() < 2) return State::NeedMore;
        if (in_.compare(0, 2, "\r\n") != 0) return refuse(400, "trailer fields after a chunked body are not supported");
        in_.erase(0, 2);
        return State::Complete;
    }
  }
}

std::string RequestReader::take_request() {
  auto [head, body] = take_request_parts();
  return head + body;
}

std::pair<std::string, std::string> RequestReader::take_request_parts() {
  std::string head = std::move(head_), body;
  head += "\r\n";
  if (keep_body_ && head_has_length_) head += "Content-Length: " + std::to_string(body_.size()) + "\r\n";
  head += "\r\n";
  if (keep_body_) body = std::move(body_);
  head_.clear();
  body_ = std::string();
  method_.clear();
  target_.clear();
  head_done_ = chunked_ = continue_ = continue_sent_ = head_has_length_ = false;
  length_ = chunk_left_ = 0;
  scan_ = 0;
  state_ = State::NeedMore;
  return {std::move(head), std::move(body)};
}

void RequestReader::clear() {
  in_.clear();
  in_.shrink_to_fit();
  take_request();
}

// --- the front --------------------------------------------------------------------------------

struct Front::Conn {
  Conn(int f, const Limits& l) : fd(f), reader(l) {}
  int fd;
  std::string ip;
  int port = 0;
  RequestReader reader;
  bool lingering = false;  // refused: reading what is left and dropping it until linger_until
  bool in_epoll = false;
  std::size_t served = 0;    // requests answered on this connection
  std::int64_t counted = 0;  // what this connection adds to receiving_
  Clock::time_point idle_since = Clock::now(), request_start, last_byte, linger_until;
  std::pair<std::string, std::string> request;  // a whole request (head, body), for a worker
  std::string method, target;                   // of that request, for the log
};

// cpp-httplib's view of one request: its bytes from memory (the front read and checked them),
// the response to the socket (or to a string for serve_bytes).
class Front::Stream final : public httplib::Stream {
 public:
  Stream(std::pair<std::string, std::string> in, int fd, double write_timeout_s, std::string ip, int port, std::string* sink)
      : head_(std::move(in.first)),
        body_(std::move(in.second)),
        fd_(fd),
        timeout_ms_(static_cast<int>(write_timeout_s * 1000)),
        ip_(std::move(ip)),
        port_(port),
        sink_(sink) {}

  bool is_readable() const override { return pos_ < head_.size() + body_.size(); }
  bool is_writable() const override {
    if (sink_) return true;
    if (failed_) return false;
    pollfd p{fd_, POLLOUT, 0};
    return ::poll(&p, 1, timeout_ms_) > 0 && !(p.revents & (POLLERR | POLLHUP | POLLNVAL));
  }
  ssize_t read(char* ptr, std::size_t size) override {
    const std::string& from = pos_ < head_.size() ? head_ : body_;
    const std::size_t at = pos_ < head_.size() ? pos_ : pos_ - head_.size();
    const std::size_t n = std::min(size, from.size() - at);
    std::memcpy(ptr, from.data() + at, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, std::size_t size) override {
    if (failed_) return -1;
    if (sink_) {
      sink_->append(ptr, size);
      written_ += static_cast<std::int64_t>(size);
      return static_cast<ssize_t>(size);
    }
    std::size_t off = 0;
    while (off < size) {
      const ssize_t n = ::send(fd_, ptr + off, size - off, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        off += static_cast<std::size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        pollfd p{fd_, POLLOUT, 0};
        const int r = ::poll(&p, 1, timeout_ms_);
        if (r > 0 && !(p.revents & (POLLERR | POLLHUP | POLLNVAL))) continue;
      }
      failed_ = true;  // the client went away, or read nothing for the write timeout
      return -1;
    }
    written_ += static_cast<std::int64_t>(size);
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override { ip = ip_, port = port_; }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip.clear(), port = 0;
    if (fd_ < 0) return;
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) return;
    char host[NI_MAXHOST], serv[NI_MAXSERV];
    if (getnameinfo(reinterpret_cast<sockaddr*>(&a), len, host, sizeof host, serv, sizeof serv,
                    NI_NUMERICHOST | NI_NUMERICSERV) == 0)
      ip = host, port = std::atoi(serv);
  }
  socket_t socket() const override { return fd_; }

  bool consumed_all() const { return pos_ == head_.size() + body_.size(); }
  bool failed() const { return failed_; }
  std::int64_t written() const { return written_; }

 private:
  std::string head_, body_;  // the request, read in turn
  std::size_t pos_ = 0;
  int fd_;
  int timeout_ms_;
  std::string ip_;
  int port_;
  std::string* sink_;
  bool failed_ = false;
  std::int64_t written_ = 0;
};

Front::Front(const Limits& limits) : limits_(limits) {
  limits_.validate();
  // The accept loop wakes every 100 ms (its idle beat) so that a stop that came before it
  // started listening still ends it.
  set_idle_interval(0, 100000);
  new_task_queue = [this] {
    return new HandOver([this] {
      if (stopping_ && is_running()) httplib::Server::stop();
    });
  };
  set_payload_max_length(limits_.max_body_bytes);
  set_keep_alive_max_count(limits_.keep_alive_requests);
  set_keep_alive_timeout(static_cast<time_t>(std::max(1.0, limits_.keep_alive_timeout_s)));
  set_logger([](const httplib::Request&, const httplib::Response& res) {
    if (!t_request) return;
    t_request->status = res.status;
    if (res.status >= 400) t_request->reason = reason_of(res.body);
  });
  // A request's buffers (bodies up to the limit, their copies in cpp-httplib and the parser) are
  // made on whichever worker serves it, and glibc keeps what a thread's arena freed: after a few
  // rounds of large requests over the 90-odd workers the process held hundreds of MB it no longer
  // used. Blocks of 1 MiB and more are mapped apart and given back when freed (a fixed threshold;
  // glibc's own rises to 32 MiB after the first large free, and then keeps them).
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  // Each connection is a file descriptor: let the process open as many as the limit asks for.
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) == 0) {
    const rlim_t want = static_cast<rlim_t>(limits_.max_connections) + 256;
    if (r.rlim_cur < want) {
      r.rlim_cur = std::min(want, r.rlim_max);
      setrlimit(RLIMIT_NOFILE, &r);
      getrlimit(RLIMIT_NOFILE, &r);
    }
    if (r.rlim_cur < want) {
      const std::size_t fits = r.rlim_cur > 320 ? static_cast<std::size_t>(r.rlim_cur - 256) : 64;
      std::fprintf(stderr, "http: the file descriptor limit (%llu) holds %zu connections, not %zu\n",
                   static_cast<unsigned long long>(r.rlim_cur), fits, limits_.max_connections);
      limits_.max_connections = fits;
    }
  }
}

Front::~Front() {
  stop_serving();
  if (loop_thread_.joinable()) loop_thread_.join();
  if (workers_) workers_->shutdown();
  for (auto& c : incoming_) ::close(c->fd);
  for (auto& [fd, c] : conns_) ::close(fd);
  if (epoll_ >= 0) ::close(epoll_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

int Front::bind(const std::string& host, int port) {
  // A dotted quad that is not an IPv4 address would go to the resolver and come back as "no such
  // host": say what is wrong with it instead.
  const bool dotted = !host.empty() && std::all_of(host.begin(), host.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c)) || c == '.';
  });
  in_addr v4{};
  IL_CHECK(!dotted || inet_pton(AF_INET, host.c_str(), &v4) == 1, "--host '", host,
           "' is not a valid IPv4 address (four numbers from 0 to 255)");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  IL_CHECK(rc == 0 && found, "cannot resolve --host '", host, "': ", gai_strerror(rc));
  // A probe bound as cpp-httplib binds (SO_REUSEADDR), to name why binding fails.
  const int probe = ::socket(found->ai_family, found->ai_socktype, found->ai_protocol);
  int err = 0;
  if (probe >= 0) {
    int yes = 1;
    setsockopt(probe, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (::bind(probe, found->ai_addr, found->ai_addrlen) != 0) err = errno;
    ::close(probe);
  } else {
    err = errno;
  }
  freeaddrinfo(found);
  if (err == EADDRNOTAVAIL)
    fail("--host '", host, "' is not an address of this machine (127.0.0.1: this machine only; 0.0.0.0: every interface)");
  if (err == EADDRINUSE)
    fail("cannot listen on ", url(host, port),
         ": the port is in use (is another server on it? --port 0 takes any free one)");
  if (err == EACCES)
    fail("cannot listen on ", url(host, port), ": ports below 1024 need privileges; choose a higher --port");
  if (err != 0) fail("cannot listen on ", url(host, port), ": ", std::strerror(err));
  const int bound = port == 0 ? bind_to_any_port(host) : (bind_to_port(host, port) ? port : -1);
  IL_CHECK(bound > 0, "cannot listen on ", url(host, port), ": ", std::strerror(errno));
  // cpp-httplib listens with a backlog of 5: a burst of clients connecting at once would find the
  // queue full and some be reset before the server sees them. A second listen() sets the backlog.
  ::listen(svr_sock_, SOMAXCONN);
  return bound;
}

void Front::serve() {
  if (epoll_ < 0) {
    epoll_ = epoll_create1(EPOLL_CLOEXEC);
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    IL_CHECK(epoll_ >= 0 && wake_fd_ >= 0, "http: cannot create the event loop: ", std::strerror(errno));
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = wake_fd_;
    epoll_ctl(epoll_, EPOLL_CTL_ADD, wake_fd_, &ev);
  }
  workers_ = std::make_unique<httplib::ThreadPool>(limits_.workers);
  loop_thread_ = std::thread([this] { loop(); });
  if (!stopping_) listen_after_bind();  // until stop_serving()
  stopping_ = true;
  wake();
  loop_thread_.join();
  workers_->shutdown();  // the handlers running finish
  workers_.reset();
  std::vector<std::unique_ptr<Conn>> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    left.swap(incoming_);
  }
  for (auto& c : left) close_conn(std::move(c));
}

void Front::stop_serving() {
  stopping_ = true;
  if (is_running()) httplib::Server::stop();
  if (wake_fd_ >= 0) wake();
}

void Front::wake() {
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(wake_fd_, &one, sizeof one);
}

Front::Stats Front::stats() const { return {open_.load(), receiving_.load(), refused_.load()}; }

std::string Front::refusal(int status, const std::string& why) const {
  const nlohmann::json body = {{"error",
                                {{"message", why},
                                 {"type", status >= 500 ? "server_error" : "invalid_request_error"},
                                 {"param", nullptr},
                                 {"code", nullptr}}}};
  const std::string text = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string r = "HTTP/1.1 " + std::to_string(status) + " " + status_text(status) + "\r\n";
  r += "Content-Type: application/json\r\nContent-Length: " + std::to_string(text.size()) + "\r\nConnection: close\r\n";
  if (status == 503) r += "Retry-After: 1\r\n";
  return r + "\r\n" + text;
}

bool Front::process_and_close_socket(socket_t sock) {
  // On cpp-httplib's accept thread: hand the connection to the event loop, or refuse it.
  set_nonblocking(sock);
  int yes = 1;
  setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);  // a stream's small events go out at once
  auto c = std::make_unique<Conn>(sock, limits_);
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (getpeername(sock, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    char host[NI_MAXHOST], serv[NI_MAXSERV];
    if (getnameinfo(reinterpret_cast<sockaddr*>(&a), len, host, sizeof host, serv, sizeof serv,
                    NI_NUMERICHOST | NI_NUMERICSERV) == 0)
      c->ip = host, c->port = std::atoi(serv);
  }
  ++open_;
  if (stopping_) {
    close_conn(std::move(c));
    return true;
  }
  if (static_cast<std::size_t>(open_.load()) > limits_.max_connections) {
    // The refusal is written here (a few hundred bytes fit any socket buffer) and the
    // connection lingers on the event loop, so that the client reads it rather than a reset.
    c->request_start = Clock::now();
    refuse(*c, 503,
           std::to_string(limits_.max_connections) + " connections are open, the most this server takes; retry later");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    incoming_.push_back(std::move(c));
  }
  wake();
  return true;
}

void Front::add_to_loop(std::unique_ptr<Conn> c) {
  Conn& conn = *c;
  const int fd = conn.fd;
  if (stopping_) {
    close_conn(std::move(c));
    return;
  }
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.fd = fd;
  if (epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    close_conn(std::move(c));
    return;
  }
  conn.in_epoll = true;
  conns_[fd] = std::move(c);
  // A connection back from a worker may hold the next request already (pipelining).
  if (!conn.lingering && conn.reader.started()) {
    conn.request_start = conn.last_byte = Clock::now();
    const RequestReader::State s = conn.reader.feed({});
    if (s == RequestReader::State::Refused) refuse(conn, conn.reader.status(), conn.reader.reason());
    else if (s == RequestReader::State::Complete) dispatch(std::move(conns_.extract(fd).mapped()));
  }
}

void Front::close_conn(std::unique_ptr<Conn> c) {
  if (c->in_epoll && epoll_ >= 0) epoll_ctl(epoll_, EPOLL_CTL_DEL, c->fd, nullptr);
  ::shutdown(c->fd, SHUT_WR);
  ::close(c->fd);
  receiving_ -= c->counted;
  --open_;
}

void Front::refuse(Conn& c, int status, const std::string& why) {
  ++refused_;
  if (on_refusal_) on_refusal_(status);
  const std::string r = refusal(status, why);
  log_line(c.ip + ":" + std::to_string(c.port), c.reader.method(), c.reader.target(), status,
           static_cast<std::int64_t>(r.size()), c.reader.started() ? seconds_since(c.request_start) : 0, {}, why);
  [[maybe_unused]] const ssize_t n = ::send(c.fd, r.data(), r.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  ::shutdown(c.fd, SHUT_WR);
  c.reader.clear();
  receiving_ -= c.counted;
  c.counted = 0;
  c.lingering = true;
  c.linger_until =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limits_.linger_s));
}

void Front::read_from(Conn& c) {
  static thread_local std::vector<char> buf(64 << 10);
  for (int round = 0; round < 16; ++round) {  // at most 1 MiB a wake-up: the other connections get their turn
    const ssize_t n = ::recv(c.fd, buf.data(), buf.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {  // the client closed (or the connection broke)
      close_conn(std::move(conns_.extract(c.fd).mapped()));
      return;
    }
    if (c.lingering) continue;  // read and dropped
    if (!c.reader.started()) c.request_start = Clock::now();
    c.last_byte = Clock::now();
    const RequestReader::State s = c.reader.feed({buf.data(), static_cast<std::size_t>(n)});
    const auto now_held = static_cast<std::int64_t>(c.reader.buffered());
    receiving_ += now_held - c.counted;
    c.counted = now_held;
    if (s == RequestReader::State::Refused) return refuse(c, c.reader.status(), c.reader.reason());
    if (static_cast<std::size_t>(receiving_.load()) > limits_.max_receiving_bytes)
      return refuse(c, 503,
                    "the server holds " + mib(limits_.max_receiving_bytes) +
                        " of requests already, the most it takes; retry later");
    if (c.reader.wants_continue()) {
      static constexpr char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
      [[maybe_unused]] const ssize_t w = ::send(c.fd, kContinue, sizeof kContinue - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      c.reader.continue_sent();
    }
    if (s == RequestReader::State::Complete) return dispatch(std::move(conns_.extract(c.fd).mapped()));
  }
}

void Front::dispatch(std::unique_ptr<Conn> c) {
  if (c->in_epoll) epoll_ctl(epoll_, EPOLL_CTL_DEL, c->fd, nullptr);
  c->in_epoll = false;
  c->method = c->reader.method();
  c->target = c->reader.target();
  c->request = c->reader.take_request_parts();
  ++dispatched_;
  Conn* raw = c.release();  // std::function needs a copyable callable
  workers_->enqueue([this, raw] { work(std::unique_ptr<Conn>(raw)); });
}

void Front::work(std::unique_ptr<Conn> c) {
  RequestContext ctx;
  ctx.fd = c->fd;
  t_request = &ctx;
  Stream strm(std::move(c->request), c->fd, limits_.write_timeout_s, c->ip, c->port, nullptr);
  c->request = {};
  const bool close = stopping_ || c->served + 1 >= limits_.keep_alive_requests;
  bool closed = false;
  bool ok = false;
  try {
    ok = process_request(strm, close, closed, nullptr);
  } catch (const std::exception& e) {  // nothing may leave a worker
    ctx.status = 500, ctx.reason = e.what();
  }
  t_request = nullptr;
  ++c->served;
  log_line(c->ip + ":" + std::to_string(c->port), c->method, c->target, ctx.status, strm.written(),
           seconds_since(c->request_start), ctx.notes, ctx.reason);
  const auto now_held = static_cast<std::int64_t>(c->reader.buffered());
  receiving_ += now_held - c->counted;
  c->counted = now_held;
  if (!ok || closed || close || stopping_ || strm.failed() || !strm.consumed_all()) {
    close_conn(std::move(c));
  } else {
    c->idle_since = Clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    incoming_.push_back(std::move(c));
  }
  if (wake_fd_ >= 0) wake();
  --dispatched_;
}

void Front::loop() {
  std::vector<epoll_event> events(256);
  auto swept = Clock::now();
  while (!stopping_) {
    const int n = epoll_wait(epoll_, events.data(), static_cast<int>(events.size()), 100);
    std::vector<std::unique_ptr<Conn>> arrived;
    {
      std::lock_guard<std::mutex> lock(mu_);
      arrived.swap(incoming_);
    }
    for (auto& c : arrived) add_to_loop(std::move(c));
    for (int i = 0; i < n; ++i) {
      const int fd = events[static_cast<std::size_t>(i)].data.fd;
      if (fd == wake_fd_) {
        std::uint64_t v;
        while (::read(wake_fd_, &v, sizeof v) > 0) {
        }
        continue;
      }
      const auto it = conns_.find(fd);
      if (it != conns_.end()) read_from(*it->second);
    }
    const auto now = Clock::now();
    if (now - swept < std::chrono::milliseconds(100)) continue;
    swept = now;
    // Time limits: a connection that says nothing, a head or a body that stops coming, a refusal
    // whose client has had its time to read the answer.
    std::vector<int> expired;
    for (auto& [fd, cp] : conns_) {
      Conn& c = *cp;
      if (c.lingering) {
        if (now >= c.linger_until) expired.push_back(fd);
      } else if (!c.reader.started()) {
        const double limit = c.served == 0 ? limits_.header_timeout_s : limits_.keep_alive_timeout_s;
        if (std::chrono::duration<double>(now - c.idle_since).count() > limit) expired.push_back(fd);
      } else if (!c.reader.head_done()) {
        if (std::chrono::duration<double>(now - c.request_start).count() > limits_.header_timeout_s)
          refuse(c, 408, "the request head did not arrive within " + secs(limits_.header_timeout_s));
      } else if (std::chrono::duration<double>(now - c.last_byte).count() > limits_.body_timeout_s) {
        refuse(c, 408, "the request body stopped arriving (nothing for " + secs(limits_.body_timeout_s) + ")");
      }
    }
    for (int fd : expired) close_conn(std::move(conns_.extract(fd).mapped()));
  }
  for (auto it = conns_.begin(); it != conns_.end();) {
    auto next = std::next(it);
    close_conn(std::move(conns_.extract(it).mapped()));
    it = next;
  }
}

bool Front::client_gone() {
  if (!t_request || t_request->fd < 0) return false;
  pollfd p{t_request->fd, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  char byte;
  return ::recv(t_request->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

void Front::note(const std::string& key, std::int64_t value) {
  if (!t_request) return;
  for (auto& [k, v] : t_request->notes)
    if (k == key) {
      v = value;
      return;
    }
  t_request->notes.emplace_back(key, value);
}

void Front::log_line(const std::string& peer, const std::string& method, const std::string& target, int status,
                     std::int64_t bytes, double seconds, const std::vector<std::pair<std::string, std::int64_t>>& notes,
                     const std::string& reason) {
  if (log_format_ == LogFormat::None && status < 500) return;
  const auto wall = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(wall);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char when[64];
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(wall.time_since_epoch()).count() % 1000;
  std::snprintf(when, sizeof when, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
  const std::string path = target.substr(0, 200);
  std::string line;
  if (log_format_ == LogFormat::Json) {
    nlohmann::json j = {{"time", when},     {"peer", peer},   {"method", method},     {"path", path},
                        {"status", status}, {"bytes", bytes}, {"duration_s", seconds}};
    for (const auto& [k, v] : notes) j[k] = v;
    if (!reason.empty() && (status >= 400 || status == 0)) j["error"] = reason;
    line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  } else {
    char head[96];
    std::snprintf(head, sizeof head, " %d %lld B %.3f s", status, static_cast<long long>(bytes), seconds);
    line = std::string(when) + " " + peer + " \"" + (method.empty() ? "-" : method) + " " + (path.empty() ? "-" : path) +
           "\"" + head;
    for (const auto& [k, v] : notes) line += " " + k + "=" + std::to_string(v);
    if (!reason.empty() && (status >= 400 || status == 0))
      line += " error=" + nlohmann::json(reason).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    line += "\n";
  }
  std::fputs(line.c_str(), log_to_);
  std::fflush(log_to_);
}

std::string Front::serve_bytes(std::string_view raw) {
  RequestReader reader(limits_);
  std::string out;
  RequestReader::State s = reader.feed(raw);
  for (std::size_t served = 0;;) {
    if (reader.wants_continue()) {
      out += "HTTP/1.1 100 Continue\r\n\r\n";
      reader.continue_sent();
    }
    if (s == RequestReader::State::Refused) {
      out += refusal(reader.status(), reader.reason());
      return out;
    }
    if (s == RequestReader::State::NeedMore) return out;  // the connection ends in the middle of a request
    RequestContext ctx;
    t_request = &ctx;
    Stream strm(reader.take_request_parts(), -1, limits_.write_timeout_s, "127.0.0.1", 0, &out);
    const bool close = ++served >= limits_.keep_alive_requests;
    bool closed = false;
    const bool ok = process_request(strm, close, closed, nullptr);
    t_request = nullptr;
    if (!ok || closed || close || !strm.consumed_all()) return out;
    s = reader.feed({});
  }
}

}  // namespace inferlab::http
