#pragma once
/// @file http_front.h
/// @brief An HTTP/1.1 front for cpp-httplib's server that a client cannot starve, balloon or kill.
///
/// cpp-httplib (0.11, as Debian ships it) gives each accepted connection a thread of its pool and
/// reads the request there: a connection that sends nothing holds a thread for the read timeout,
/// so a few hundred idle or slow clients keep every other client waiting; a chunked body has no
/// size limit; headers have no count limit; a long request line is buffered whole. The front
/// keeps cpp-httplib for what it does well (routing, the handlers, writing responses and
/// streams) and takes over the connection before any of that:
///
/// - one event loop (epoll) holds every connection that is between requests or still sending
///   one: idle, slow and half-sent connections cost a few hundred bytes, not a thread;
/// - the request is read there within Limits: the request line, the number and size of the
///   headers, Content-Length checked as a number, a chunked body decoded and counted as it
///   arrives, the bodies being received counted against one budget, and time limits for the
///   head, for a body that stops, and for an idle keep-alive connection. What breaks a limit is
///   answered at once (400, 408, 413, 414, 415, 417, 431, 501, 503, 505) and the connection is
///   closed after the client has had a moment to read the answer;
/// - a whole request, normalised (chunked framing decoded into a Content-Length body, Expect
///   answered by the front), goes to a worker thread, where cpp-httplib's own request processing
///   parses and routes it and writes the response to the socket;
/// - beyond Limits::max_connections, a new connection is answered 503 and closed at once;
/// - each request ends with an access-log line (text or JSON): method, path, status, bytes,
///   duration and what the handler noted (tokens); a 5xx line carries its reason.
///
/// A handler runs on the worker thread that serves its request, so it can ask whether its client
/// is still there (client_gone(), for a long request that writes nothing until the end) and add
/// to its log line (note()).

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace inferlab::http {

/// What one client may send, and for how long; each has a ch13_serve flag (docs/reliability.md).
struct Limits {
  std::size_t max_request_line = 8192;          ///< bytes of the request line with its CRLF; more: 414
  std::size_t max_header_line = 8192;           ///< bytes of one header line; more: 431
  std::size_t max_headers = 100;                ///< header lines; more: 431 (--max-headers)
  std::size_t max_head_bytes = 64 << 10;        ///< request line and headers in all; more: 431 (--max-header-kib)
  std::size_t max_body_bytes = 8 << 20;         ///< a body, decoded; more: 413 (--max-body-mib)
  std::size_t max_receiving_bytes = 256 << 20;  ///< bodies being received, all connections; more: 503 (--max-receiving-mib)
  std::size_t max_connections = 1024;           ///< open connections; more: 503 at once (--max-connections)
  double header_timeout_s = 10;                 ///< the head must arrive within this; else 408 (--header-timeout)
  double body_timeout_s = 10;                   ///< a body that sends nothing for this long: 408 (--body-timeout)
  double keep_alive_timeout_s = 5;              ///< an idle connection between requests is closed (--keep-alive-timeout)
  std::size_t keep_alive_requests = 100;        ///< requests on one connection, then it is closed (--keep-alive-requests)
  double write_timeout_s = 10;                  ///< a client that reads nothing for this long is gone (--write-timeout)
  std::size_t workers = 16;                     ///< threads that run handlers: requests served at once
  double linger_s = 1;                          ///< after a refusal, how long the rest of the input is read and dropped

  /// Throws naming the field when a value is out of its range.
  void validate() const;
};

/// How the access log is written: one line of text, one JSON object, or nothing (5xx are logged
/// in any case).
enum class LogFormat { Text, Json, None };
LogFormat parse_log_format(const std::string& s);

/// One request, incrementally: bytes go in as they arrive, and out comes "need more", a refusal
/// (an HTTP status and why), or a whole request normalised for cpp-httplib. Used by the front's
/// event loop and, over a string, by tests and the fuzz target.
class RequestReader {
 public:
  enum class State { NeedMore, Complete, Refused };
  explicit RequestReader(const Limits& limits) : limits_(limits) {}

  /// Adds `bytes` to what arrived and parses as far as it can.
  State feed(std::string_view bytes);
  State state() const { return state_; }
  /// With Refused: the status to answer, and why (for the client).
  int status() const { return status_; }
  const std::string& reason() const { return reason_; }

  /// With Complete: the request as cpp-httplib is given it (request line, headers without
  /// Transfer-Encoding, Expect and Content-Length, then Content-Length and the decoded body),
  /// and the reader starts on the next request with the bytes that came after this one.
  std::string take_request();
  /// take_request() as its head and its body, apart (the body is not copied).
  std::pair<std::string, std::string> take_request_parts();
  /// Drops everything held (a refused connection reads nothing more).
  void clear();
  /// The head of the request asked for "100 Continue" and was accepted: the front should send it
  /// (once; this says true until take_request()).
  bool wants_continue() const { return continue_ && !continue_sent_; }
  void continue_sent() { continue_sent_ = true; }

  /// Whether any byte of a request has arrived (false between requests).
  bool started() const { return !in_.empty() || head_done_; }
  bool head_done() const { return head_done_; }
  /// Bytes held: unparsed input and the decoded body so far.
  std::size_t buffered() const { return in_.size() + body_.size(); }
  /// Of the request being read, once its head is in: for the log.
  const std::string& method() const { return method_; }
  const std::string& target() const { return target_; }

 private:
  State refuse(int status, std::string why);
  State parse_head();
  State parse_body();

  Limits limits_;
  State state_ = State::NeedMore;
  int status_ = 0;
  std::string reason_;
  std::string in_;        // bytes not yet parsed
  std::size_t scan_ = 0;  // how far in_ was searched for the end of the head
  bool head_done_ = false;
  std::string head_;  // normalised request line and headers, without the final CRLF
  std::string method_, target_;
  bool keep_body_ = true;  // cpp-httplib reads bodies of POST, PUT, PATCH, DELETE and PRI only
  bool chunked_ = false, continue_ = false, continue_sent_ = false;
  bool head_has_length_ = false;  // a body was framed (Content-Length or chunked)
  std::uint64_t length_ = 0;      // Content-Length
  std::string body_;              // the body so far, decoded
  // chunked: the size of the chunk being read (remaining bytes), and where the decoder is
  enum class Chunk { Size, Data, DataEnd, Trailer } chunk_ = Chunk::Size;
  std::uint64_t chunk_left_ = 0;
};

/// cpp-httplib's server behind the event loop described above. Routes are added to it as to any
/// httplib::Server; then bind() and serve().
class Front : public httplib::Server {
 public:
  explicit Front(const Limits& limits = {});
  ~Front() override;
  Front(const Front&) = delete;
  Front& operator=(const Front&) = delete;

  /// Listens on host:port (0: any free port) and returns the port. Throws inferlab::Error
  /// naming what is wrong: a host that does not resolve, is not a valid address, or is not an
  /// address of this machine; a port in use or below 1024 without the right.
  int bind(const std::string& host, int port);
  /// Serves until stop_serving(); returns once every connection is closed and every handler
  /// has returned.
  void serve();
  /// From any thread (a signal's waiter): stops accepting and ends serve(). Handlers that are
  /// running finish; connections between requests are closed.
  void stop_serving();
  bool serving() const { return is_running(); }

  /// The access log: its format, and where it goes (stderr unless set).
  void set_access_log(LogFormat f, std::FILE* to = stderr) { log_format_ = f, log_to_ = to; }
  /// The body of a refusal the front answers itself, as (content type, body); JSON
  /// {"error": {"message": …}} unless set. Called on the event loop: it must not block.
  using RefusalBody = std::function<std::pair<std::string, std::string>(int status, const std::string& message)>;
  void set_refusal_body(RefusalBody f) { refusal_body_ = std::move(f); }
  /// Called (on the event loop) for every refusal the front answers itself.
  void on_refusal(std::function<void(int status)> f) { on_refusal_ = std::move(f); }

  /// Serves `raw` as the bytes of one connection, in this thread, and returns what was written
  /// back: each request in turn, as the event loop and a worker would serve them (tests, fuzzing).
  std::string serve_bytes(std::string_view raw);

  struct Stats {
    std::int64_t open = 0;       ///< connections open
    std::int64_t receiving = 0;  ///< bytes of requests being received, all connections
    std::int64_t refused = 0;    ///< refusals the front answered itself
  };
  Stats stats() const;
  const Limits& limits() const { return limits_; }

  /// From a handler: whether the client of the request this thread serves has closed its
  /// connection (false outside a handler, and in serve_bytes()).
  static bool client_gone();
  /// From a handler: adds `key`=`value` to its request's access-log line.
  static void note(const std::string& key, std::int64_t value);

 private:
  struct Conn;
  class Stream;
  bool process_and_close_socket(socket_t sock) override;  // cpp-httplib's accept loop hands over here
  void loop();
  void add_to_loop(std::unique_ptr<Conn> c);
  void read_from(Conn& c);
  void refuse(Conn& c, int status, const std::string& why);
  void dispatch(std::unique_ptr<Conn> c);
  void work(std::unique_ptr<Conn> c);
  void close_conn(std::unique_ptr<Conn> c);
  void wake();
  std::string refusal(int status, const std::string& why) const;
  void log_line(const std::string& peer, const std::string& method, const std::string& target, int status,
                std::int64_t bytes, double seconds, const std::vector<std::pair<std::string, std::int64_t>>& notes,
                const std::string& reason);

  Limits limits_;
  LogFormat log_format_ = LogFormat::Text;
  std::FILE* log_to_ = stderr;
  RefusalBody refusal_body_;
  std::function<void(int)> on_refusal_;

  int epoll_ = -1, wake_fd_ = -1;
  std::thread loop_thread_;
  std::unique_ptr<httplib::ThreadPool> workers_;
  std::mutex mu_;                                // guards incoming_ and log writes
  std::vector<std::unique_ptr<Conn>> incoming_;  // from the accept loop and the workers, for the event loop
  std::map<int, std::unique_ptr<Conn>> conns_;   // event loop only
  std::atomic<bool> stopping_{false};
  std::atomic<std::int64_t> open_{0}, receiving_{0}, refused_{0};
  std::atomic<std::int64_t> dispatched_{0};
  std::mutex done_mu_;
  std::condition_variable done_cv_;
};

/// "http://HOST:PORT", with an IPv6 address in brackets.
std::string url(const std::string& host, int port);

}  // namespace inferlab::http
