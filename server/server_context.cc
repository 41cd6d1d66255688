#include "server/server_context.h"

#include "core/error.h"
#include "server/api_error.h"
#include "server/openai_response.h"

namespace m3::server {

ServerContext::ServerContext(ServeOptions options)
    : options_(std::move(options)),
      metrics_(options_.served_model_names.empty() ? std::string()
                                                   : options_.served_model_names.front()),
      responses_(options_.response_store),
      start_time_(unix_time_seconds()) {
  M3_CHECK(!options_.served_model_names.empty(), "the server needs at least one served model name");
}

bool ServerContext::is_served_model(const std::string& name) const {
  for (const std::string& served : options_.served_model_names) {
    if (served == name) return true;
  }
  return false;
}

void ServerContext::set_model(std::shared_ptr<const ModelContext> model) {
  std::lock_guard lock(model_mutex_);
  model_ = std::move(model);
}

std::shared_ptr<const ModelContext> ServerContext::model() const {
  std::lock_guard lock(model_mutex_);
  return model_;
}

bool ServerContext::add_background(const std::string& id, std::function<void()> cancel) {
  std::lock_guard lock(background_mutex_);
  if (background_.size() >= options_.response_store.max_entries) return false;
  background_[id] = std::move(cancel);
  return true;
}

void ServerContext::remove_background(const std::string& id) {
  std::lock_guard lock(background_mutex_);
  background_.erase(id);
}

std::function<void()> ServerContext::background_cancel(const std::string& id) const {
  std::lock_guard lock(background_mutex_);
  auto it = background_.find(id);
  return it == background_.end() ? std::function<void()>() : it->second;
}

std::shared_ptr<const ModelContext> ServerContext::require_model() const {
  if (draining_) throw ApiError(503, "the server is shutting down");
  auto model = this->model();
  if (!model) throw ApiError(503, "the model is still loading; retry when /health returns 200");
  return model;
}

}  // namespace m3::server
