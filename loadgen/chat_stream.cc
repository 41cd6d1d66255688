#include "loadgen/chat_stream.h"

#include <nlohmann/json.hpp>

namespace m3::loadgen {

using nlohmann::json;

void SseParser::feed(const char* data, size_t size) {
  pending_.append(data, size);
  for (;;) {
    // Events end at a blank line; servers write \n\n (\r\n\r\n is accepted too).
    size_t end = pending_.find("\n\n");
    size_t sep = 2;
    const size_t crlf = pending_.find("\r\n\r\n");
    if (crlf != std::string::npos && (end == std::string::npos || crlf < end)) end = crlf, sep = 4;
    if (end == std::string::npos) return;
    std::string event = pending_.substr(0, end);
    pending_.erase(0, end + sep);
    std::string payload;
    size_t start = 0;
    while (start <= event.size()) {
      size_t nl = event.find('\n', start);
      std::string line = event.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.rfind("data:", 0) == 0) {
        std::string value = line.substr(5);
        if (!value.empty() && value.front() == ' ') value.erase(0, 1);
        if (!payload.empty()) payload += '\n';
        payload += value;
      }
      if (nl == std::string::npos) break;
      start = nl + 1;
    }
    if (!payload.empty()) on_data_(payload);
  }
}

namespace {

bool non_empty_string(const json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() && !it->get_ref<const std::string&>().empty();
}

}  // namespace

ChunkInfo parse_chunk(const std::string& data) {
  ChunkInfo info;
  if (data == "[DONE]") {
    info.done = true;
    return info;
  }
  json j = json::parse(data, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    info.error = "a stream chunk is not JSON: " + data.substr(0, 200);
    return info;
  }
  if (auto e = j.find("error"); e != j.end()) {
    info.error = e->is_object() && e->contains("message") ? e->at("message").dump() : e->dump();
    return info;
  }
  if (auto choices = j.find("choices"); choices != j.end() && choices->is_array()) {
    for (const json& c : *choices) {
      if (!c.is_object()) continue;
      if (non_empty_string(c, "text")) info.has_text = true;
      if (auto d = c.find("delta"); d != c.end() && d->is_object()) {
        if (non_empty_string(*d, "content") || non_empty_string(*d, "reasoning_content") ||
            non_empty_string(*d, "reasoning") || (d->contains("tool_calls") && !d->at("tool_calls").empty())) {
          info.has_text = true;
        }
      }
    }
  }
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    info.has_usage = true;
    info.prompt_tokens = u->value("prompt_tokens", int64_t{0});
    info.completion_tokens = u->value("completion_tokens", int64_t{0});
    if (auto d = u->find("prompt_tokens_details"); d != u->end() && d->is_object()) {
      if (auto c = d->find("cached_tokens"); c != d->end() && c->is_number_integer()) {
        info.cached_tokens = c->get<int64_t>();
      }
    }
  }
  return info;
}

}  // namespace m3::loadgen
