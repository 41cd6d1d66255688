#include "loadgen/prompt_text.h"

#include <algorithm>

#include "core/error.h"

namespace m3::loadgen {

namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

WordPool WordPool::builtin() {
  static const char* const kWords[] = {
      "the", "and", "for", "that", "with", "this", "from", "have", "not", "are", "but", "was", "all", "can",
      "will", "one", "which", "there", "their", "more", "when", "what", "some", "time", "into", "out", "other",
      "only", "new", "also", "use", "two", "first", "any", "may", "then", "these", "work", "such", "well",
      "many", "each", "value", "file", "line", "code", "data", "type", "test", "list", "name", "set", "get",
      "return", "self", "call", "user", "case", "error", "result", "string", "number", "check", "state", "read",
      "write", "change", "start", "end", "path", "key", "map", "run", "add", "make", "see", "way", "part",
      "point", "form", "order", "need", "find", "show", "back", "same", "last", "next", "long", "own", "over"};
  WordPool pool;
  for (const char* w : kWords) pool.words.push_back(std::string(" ") + w);
  return pool;
}

std::vector<Block> request_blocks(const TraceRequest& q, int64_t block_size, int64_t unique_base) {
  std::vector<Block> blocks;
  for (int64_t done = 0, i = 0; done < q.in; ++i) {
    const int64_t n = std::min(block_size, q.in - done);
    const int64_t id = i < static_cast<int64_t>(q.hash_ids.size()) ? q.hash_ids[i] : -(unique_base + i + 1);
    blocks.push_back({id, n});
    done += n;
  }
  return blocks;
}

std::string PromptBuilder::block_text(const Block& b) const {
  M3_CHECK(!pool_.words.empty(), "the word pool is empty");
  std::string out;
  const uint64_t base = mix(scope_ ^ mix(static_cast<uint64_t>(b.id)));
  for (int64_t i = 0; i < b.tokens; ++i) out += pool_.words[mix(base + static_cast<uint64_t>(i)) % pool_.words.size()];
  return out;
}

const std::vector<Message>& ConversationState::next(const std::vector<Block>& blocks, int64_t block_size,
                                                    int64_t prefix_tokens, int64_t last_out,
                                                    const std::string& marker, const PromptBuilder& text) {
  // Keep the messages whose blocks are this request's next blocks.
  size_t pos = 0, kept = 0;
  for (; kept < messages_.size(); ++kept) {
    const std::vector<Block>& m = messages_[kept].blocks;
    if (pos + m.size() > blocks.size() || !std::equal(m.begin(), m.end(), blocks.begin() + pos)) break;
    pos += m.size();
  }
  if (kept < messages_.size()) {
    ++resets_;
    messages_.resize(kept);
  }
  if (pos == blocks.size() && !messages_.empty()) return messages_;  // nothing new: the same prompt again
  const bool has_marker = std::any_of(messages_.begin(), messages_.end(), [&](const Message& m) {
    return !marker.empty() && m.role == "user" && m.text.rfind(marker, 0) == 0;
  });
  auto push = [&](const std::string& role, size_t count, bool with_marker) {
    Message m;
    m.role = role;
    m.blocks.assign(blocks.begin() + pos, blocks.begin() + pos + count);
    if (with_marker) m.text = marker;
    for (const Block& b : m.blocks) m.text += text.block_text(b);
    pos += count;
    messages_.push_back(std::move(m));
  };
  const size_t rest = blocks.size() - pos;
  if (rest > 1) {
    if (messages_.empty()) {
      // Turn 0: the system + tools prefix is the system message.
      const size_t system = std::min<size_t>(static_cast<size_t>(prefix_tokens / block_size), rest - 1);
      if (system > 0) push("system", system, false);
    } else {
      // Later turns: the previous answer's share of the new blocks is the assistant's message,
      // the rest arrives as the user's (a tool result).
      const size_t answer =
          std::min<size_t>(static_cast<size_t>((last_out + block_size / 2) / block_size), rest - 1);
      if (answer > 0) push("assistant", answer, false);
    }
  }
  push("user", blocks.size() - pos, !has_marker);
  return messages_;
}

std::string flatten(const std::vector<Message>& messages) {
  std::string out;
  for (const Message& m : messages) out += m.text;
  return out;
}

uint64_t scope_of(const Session& session) {
  if (session.global_hash_scope) return 0;
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the session id
  for (unsigned char c : session.id) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace m3::loadgen
