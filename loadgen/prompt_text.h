// Synthetic prompt text from block hash ids. Each token is one word from a pool of words that
// the server's tokenizer encodes as one token each (" the", " return", ...), chosen by a hash of
// (scope, block id, position in the block): requests that share a block id share its text
// exactly, so the server sees the trace's block-level prefix sharing; a block's first n words are
// the same whatever n, so a partial last block is a prefix of the full one.
//
// ConversationState keeps one agent's message array, as spans of token positions: what was sent
// stays as it was (append only), so each turn's prompt extends the last one's. The partial last
// block of a request gets a new id in the next one once it fills up (it is a hash of its tokens);
// its words already sent stay and the block goes on from there. A request whose blocks leave the
// array's path (a compaction, a context edit) cuts the array back to the messages it still shares.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "loadgen/trace.h"

namespace m3::loadgen {

// Words that are one token each, with their leading space (" word").
struct WordPool {
  std::vector<std::string> words;
  // A built-in list of common English words: one token each on the usual byte-level BPE
  // vocabularies, but only checked against a tokenizer when one is given (the app does that).
  static WordPool builtin();
};

struct Block {
  int64_t id = 0;
  int64_t tokens = 0;
  bool operator==(const Block&) const = default;
};

struct Message {
  std::string role;  // system | user | assistant
  int64_t start = 0, end = 0;  // the token positions it holds
  std::string text;
};

// The blocks of a request's input: block_size tokens each, the last one the rest. A request
// without hash ids gets ids of its own (unique per call site), so nothing is shared.
std::vector<Block> request_blocks(const TraceRequest& q, int64_t block_size, int64_t unique_base);

class PromptBuilder {
 public:
  PromptBuilder(const WordPool& pool, uint64_t scope) : pool_(pool), scope_(scope) {}
  const std::string& word(int64_t block_id, int64_t position) const;
  std::string block_text(const Block& b) const;

 private:
  const WordPool& pool_;
  uint64_t scope_;
};

class ConversationState {
 public:
  // The messages to send for a request with these blocks; `prefix_tokens` is the agent's
  // system + tools size (turn 0's system message), `last_out` the previous request's output
  // (the assistant message's share of the new tokens; the rest is the user's, a tool result),
  // `marker` the cache-bust text put at the start of the first user message, in place of its
  // first `marker_tokens` words (so the prompt keeps its token count; 0 when unknown).
  const std::vector<Message>& next(const std::vector<Block>& blocks, int64_t block_size, int64_t prefix_tokens,
                                   int64_t last_out, const std::string& marker, int64_t marker_tokens,
                                   const PromptBuilder& text);
  // Times a request left the array's path (messages were dropped).
  int resets() const { return resets_; }

 private:
  std::vector<Message> messages_;
  std::vector<int64_t> ids_;  // the block ids of the last request
  int64_t sent_ = 0;          // token positions the messages hold
  int resets_ = 0;
};

// The whole prompt as one string (for /v1/completions): the messages' texts back to back.
std::string flatten(const std::vector<Message>& messages);

uint64_t scope_of(const Session& session);  // 0 for a global scope, else a hash of the id

}  // namespace m3::loadgen
