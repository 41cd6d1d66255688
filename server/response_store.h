// The responses /v1/responses keeps for `previous_response_id`, GET / DELETE /v1/responses/{id}
// and GET /v1/responses/{id}/input_items: in memory, bounded by a count and by bytes, least recently used first out.
// A response created with `store: false` never enters; an evicted or deleted one is gone (a later
// previous_response_id to it is a 404 naming the field). Thread-safe: handlers put and get from
// the handler pool and the connections' threads.
#pragma once
#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>

#include "server/json_fields.h"

namespace m3::server {

struct ResponseStoreLimits {
  size_t max_entries = 1024;       // 0: nothing is stored
  size_t max_bytes = size_t{256} << 20;  // of the entries' JSON text
};

struct StoredResponse {
  std::string id;
  // The whole conversation as chat messages, the response's own output last (without the
  // request's instructions, which a follow-up request does not inherit): what a request with
  // previous_response_id continues.
  Json conversation;
  nlohmann::json response;  // the response object, as GET /v1/responses/{id} returns it
  nlohmann::json input_items = nlohmann::json::array();  // this request's input, with ids
  size_t bytes = 0;         // its share of max_bytes (set by put)
};

class ResponseStore {
 public:
  explicit ResponseStore(ResponseStoreLimits limits = {});

  // Stores (or replaces) `entry` as the most recently used, then evicts the least recently used
  // ones until both bounds hold. An entry larger than max_bytes on its own is not stored: false.
  bool put(StoredResponse entry);
  // The entry (now the most recently used), or null.
  std::shared_ptr<const StoredResponse> get(const std::string& id);
  // False when there was no such entry.
  bool erase(const std::string& id);

  size_t size() const;
  size_t bytes() const;
  const ResponseStoreLimits& limits() const { return limits_; }

 private:
  using Order = std::list<std::shared_ptr<const StoredResponse>>;  // most recent first
  void evict_locked();

  ResponseStoreLimits limits_;
  mutable std::mutex mutex_;
  Order order_;
  std::unordered_map<std::string, Order::iterator> index_;
  size_t bytes_ = 0;
};

}  // namespace m3::server
