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

const std::string& PromptBuilder::word(int64_t block_id, int64_t position) const {
  M3_CHECK(!pool_.words.empty(), "the word pool is empty");
  const uint64_t base = mix(scope_ ^ mix(static_cast<uint64_t>(block_id)));
  return pool_.words[mix(base + static_cast<uint64_t>(position)) % pool_.words.size()];
}

std::string PromptBuilder::block_text(const Block& b) const {
  std::string out;
  for (int64_t i = 0; i < b.tokens; ++i) out += word(b.id, i);
  return out;
}

const std::vector<Message>& ConversationState::next(const std::vector<Block>& blocks, int64_t block_size,
                                                    int64_t prefix_tokens, int64_t last_out,
                                                    const std::string& marker, int64_t marker_tokens,
                                                    const PromptBuilder& text) {
  int64_t total = 0;
  for (const Block& b : blocks) total += b.tokens;
  // How far the context sent so far agrees with this request.
  int64_t agree = 0;
  for (size_t j = 0; j < ids_.size() && j < blocks.size(); ++j) {
    const int64_t block_start = static_cast<int64_t>(j) * block_size;
    const int64_t sent_in_block = std::min(block_size, sent_ - block_start);
    if (sent_in_block <= 0) break;
    if (ids_[j] == blocks[j].id) {
      agree = block_start + std::min(sent_in_block, blocks[j].tokens);
      if (blocks[j].tokens < sent_in_block) break;
      continue;
    }
    // The partial last block filled up (its id changed): the words sent stay, it goes on from there.
    const bool grown_tail = j + 1 == ids_.size() && sent_in_block < block_size && blocks[j].tokens >= sent_in_block;
    agree = grown_tail ? sent_ : block_start;
    break;
  }
  if (agree < sent_) {
    ++resets_;
    while (!messages_.empty() && messages_.back().end > agree) messages_.pop_back();
    sent_ = messages_.empty() ? 0 : messages_.back().end;
  }
  ids_.clear();
  for (const Block& b : blocks) ids_.push_back(b.id);
  if (total == sent_ && !messages_.empty()) return messages_;  // nothing new: the same prompt again
  const bool has_marker = std::any_of(messages_.begin(), messages_.end(), [&](const Message& m) {
    return !marker.empty() && m.role == "user" && m.text.rfind(marker, 0) == 0;
  });
  auto push = [&](const std::string& role, int64_t count, bool with_marker) {
    Message m;
    m.role = role;
    m.start = sent_;
    m.end = sent_ + count;
    int64_t first = m.start;
    if (with_marker) {
      m.text = marker;
      first += std::clamp<int64_t>(marker_tokens, 0, count - 1);
    }
    for (int64_t p = first; p < m.end; ++p) m.text += text.word(blocks[p / block_size].id, p % block_size);
    sent_ = m.end;
    messages_.push_back(std::move(m));
  };
  const int64_t rest = total - sent_;
  if (rest > 1) {
    if (messages_.empty()) {
      // Turn 0: system + tools, leaving the user message room for the marker's tokens.
      const int64_t system = std::min(prefix_tokens, rest - 1 - std::max<int64_t>(marker_tokens, 0));
      if (system > 0) push("system", system, false);
    } else {
      const int64_t answer = std::min(last_out, rest - 1);  // the previous answer, then the tool result
      if (answer > 0) push("assistant", answer, false);
    }
  }
  push("user", total - sent_, !has_marker);
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
