#include "server/response_store.h"

#include "server/openai_response.h"

namespace m3::server {
namespace {

// What an entry holds, as its JSON text (the bound is on that; the in-memory trees are a small
// multiple of it).
size_t entry_bytes(const StoredResponse& entry) {
  return entry.id.size() + entry.conversation.dump(-1, ' ', false, Json::error_handler_t::replace).size() +
         dump_json(entry.response).size() + dump_json(entry.input_items).size();
}

}  // namespace

ResponseStore::ResponseStore(ResponseStoreLimits limits) : limits_(limits) {}

bool ResponseStore::put(StoredResponse entry) {
  entry.bytes = entry_bytes(entry);
  std::lock_guard lock(mutex_);
  if (auto it = index_.find(entry.id); it != index_.end()) {
    bytes_ -= (*it->second)->bytes;
    order_.erase(it->second);
    index_.erase(it);
  }
  if (limits_.max_entries == 0 || entry.bytes > limits_.max_bytes) return false;
  bytes_ += entry.bytes;
  std::string id = entry.id;
  order_.push_front(std::make_shared<const StoredResponse>(std::move(entry)));
  index_[id] = order_.begin();
  evict_locked();
  return true;
}

std::shared_ptr<const StoredResponse> ResponseStore::get(const std::string& id) {
  std::lock_guard lock(mutex_);
  auto it = index_.find(id);
  if (it == index_.end()) return nullptr;
  order_.splice(order_.begin(), order_, it->second);
  return order_.front();
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard lock(mutex_);
  auto it = index_.find(id);
  if (it == index_.end()) return false;
  bytes_ -= (*it->second)->bytes;
  order_.erase(it->second);
  index_.erase(it);
  return true;
}

size_t ResponseStore::size() const {
  std::lock_guard lock(mutex_);
  return order_.size();
}

size_t ResponseStore::bytes() const {
  std::lock_guard lock(mutex_);
  return bytes_;
}

void ResponseStore::evict_locked() {
  while (!order_.empty() && (order_.size() > limits_.max_entries || bytes_ > limits_.max_bytes)) {
    const auto& oldest = order_.back();
    bytes_ -= oldest->bytes;
    index_.erase(oldest->id);
    order_.pop_back();
  }
}

}  // namespace m3::server
