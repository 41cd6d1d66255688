// A per-request constraint on the tokens a sequence may generate (structured outputs: JSON
// schemas, regexes, choices, grammars, tool calls). The engine holds one per constrained sequence
// and asks it, before each sampled token, for the set of allowed tokens as a bitmask over the
// vocabulary; the sampler sets every other token's logit to -inf (ops/sampling.h). The engine
// knows nothing of grammars: implementations live above it (grammar/).
//
// The interface is shaped for speculative decoding too: drafted tokens can be checked one by one
// with accept() and taken back with rollback() when the target model rejects them.
#pragma once
#include <cstdint>
#include <memory>
#include <span>

namespace m3 {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Writes the allowed next tokens into `words` (bit i % 32 of word i / 32 is token i; the
  // span holds ceil(vocab / 32) words). `remaining_tokens` is how many tokens the sequence may
  // still produce, this one included: a constraint may restrict itself to what completes in time.
  // Returns false when no token is excluded this step (words are then left as they are).
  // Throws m3::Error when the constraint cannot go on (a size limit); the request fails with it.
  virtual bool fill_allowed(std::span<uint32_t> words, int remaining_tokens) = 0;
  // Advances over a generated token. False when the token is not allowed; the state is unchanged.
  virtual bool accept(int32_t token) = 0;
  // The output is complete and nothing may follow it: the engine ends the sequence (reason stop).
  virtual bool terminated() const = 0;
  // Takes back the last `num_tokens` accepted tokens (at most as many as were accepted).
  virtual void rollback(int num_tokens) = 0;
};

// What a request carries: the compiled constraint, from which each sequence (each of n samples)
// starts its own state. Shared and immutable from the outside; start() may be called from any
// thread.
class TokenConstraintSpec {
 public:
  virtual ~TokenConstraintSpec() = default;
  virtual std::unique_ptr<TokenConstraint> start() const = 0;
};

inline int32_t token_mask_words(int32_t vocab) { return (vocab + 31) / 32; }

// A constraint walked through drafted tokens (speculative decoding), then taken back to where it
// stood: the mask of draft j is the constraint's after drafts [0, j), with `remaining_tokens - j`
// tokens left to produce. The engine's verification masks and a drafter's draws walk the same way,
// so both see the same masks.
class DraftConstraintWalk {
 public:
  DraftConstraintWalk(TokenConstraint& constraint, int remaining_tokens)
      : constraint_(constraint), remaining_(remaining_tokens) {}
  ~DraftConstraintWalk() { constraint_.rollback(accepted_); }
  DraftConstraintWalk(const DraftConstraintWalk&) = delete;
  DraftConstraintWalk& operator=(const DraftConstraintWalk&) = delete;

  // The next token's mask (TokenConstraint::fill_allowed); false: nothing excluded.
  bool next_mask(std::span<uint32_t> words) { return constraint_.fill_allowed(words, remaining_ - accepted_); }
  // Advances over the next token; false (nothing changes) when the constraint refuses it.
  bool accept(int32_t token) {
    if (!constraint_.accept(token)) return false;
    ++accepted_;
    return true;
  }
  // The tokens walked so far complete the output: nothing may follow them.
  bool terminated() const { return constraint_.terminated(); }
  int accepted() const { return accepted_; }

 private:
  TokenConstraint& constraint_;
  int remaining_;
  int accepted_ = 0;
};

}  // namespace m3
