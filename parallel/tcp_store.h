// A small key-value store over TCP where the processes of a deployment on several hosts meet at
// start (--master-addr:--master-port): node 0 runs the server, every process (node 0 too) connects
// a client. It carries a few values only (the Gloo ranks' addresses, an NCCL unique id), so it is
// plain POSIX sockets and a request / reply per call; the collectives themselves run on Gloo or
// NCCL. Gloo takes it as its rendezvous store through GlooRendezvous::tcp (gloo_communicator.h).
//
// Values are set once and never removed; get and wait block until the keys are there or the
// timeout passes. Every error names the store's address.
#pragma once
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace m3 {

// The server: one thread polling the listener and its clients. Stops (and drops its clients) on
// destruction.
class TcpStoreServer {
 public:
  // Listens on host:port ("0.0.0.0": every interface; port 0: a free port, see port()). Throws
  // m3::Error naming the address when it cannot (a port in use, an address not of this host).
  TcpStoreServer(const std::string& host, int port);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }

 private:
  void serve();

  int listen_fd_ = -1;
  int wake_fds_[2] = {-1, -1};  // a pipe: the destructor's write ends the poll
  int port_ = 0;
  std::string address_;
  std::thread thread_;
};

// A client; safe to share between threads (each call is one request under a lock, and waits poll
// without holding it).
class TcpStore {
 public:
  // Connects to host:port, retrying while nothing listens there yet (node 0 may start after its
  // followers) until `timeout`, which is also how long get and wait wait for a key. Throws
  // m3::Error naming the address when the host does not resolve or nothing answers in time.
  static std::shared_ptr<TcpStore> connect(const std::string& host, int port, std::chrono::milliseconds timeout);
  ~TcpStore();
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const std::vector<char>& value);
  // The value of `key`, waiting up to timeout() for it to be set.
  std::vector<char> get(const std::string& key);
  // Returns once every key is set; throws m3::Error naming the keys still missing after `timeout`.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  bool contains(const std::string& key);

  std::chrono::milliseconds timeout() const { return timeout_; }
  const std::string& address() const { return address_; }  // "host:port"

 private:
  TcpStore(int fd, std::string address, std::chrono::milliseconds timeout)
      : fd_(fd), address_(std::move(address)), timeout_(timeout) {}
  // One GET: whether the key is set, and its value.
  bool try_get(const std::string& key, std::vector<char>* value);

  std::mutex mutex_;
  int fd_ = -1;
  std::string address_;
  std::chrono::milliseconds timeout_;
};

}  // namespace m3
