// The client's side of one streamed completion: SSE framing ("data: ...\n\n") and the OpenAI
// chunk fields the report needs (when text arrived, the usage the server counted).
#pragma once
#include <cstdint>
#include <functional>
#include <string>

namespace m3::loadgen {

// Splits bytes into SSE events and hands each event's data (the "data:" lines joined) to the
// callback; comment and other fields are skipped. Bytes may arrive split anywhere.
class SseParser {
 public:
  explicit SseParser(std::function<void(const std::string&)> on_data) : on_data_(std::move(on_data)) {}
  void feed(const char* data, size_t size);

 private:
  std::function<void(const std::string&)> on_data_;
  std::string pending_;
};

// What one chunk of /v1/chat/completions or /v1/completions said.
struct ChunkInfo {
  bool done = false;      // "[DONE]"
  bool has_text = false;  // content, reasoning_content, tool call arguments or completion text
  bool has_usage = false;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  int64_t cached_tokens = -1;  // usage.prompt_tokens_details.cached_tokens, -1 when absent
  std::string error;           // an error object in the stream
};

// Throws nothing: a chunk that is not JSON comes back with error set.
ChunkInfo parse_chunk(const std::string& data);

}  // namespace m3::loadgen
