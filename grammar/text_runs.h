// How far text of a class (grammar/text_class.h) can run from an automaton state: a state is
// "uniform" over the class when, for some n, every text of the class of at most n characters
// keeps it alive and every longer one kills it (a string body with n characters left, free text,
// the digits left of a number, or none at all when n = 0). The mask of a uniform state is the
// vocabulary's tokens of the class of at most n characters, in bulk, plus a walk of the other
// tokens; that is what makes string bodies and numbers cheap, counted ones (maxLength, digit
// limits) included.
//
// Computed on demand and kept per state; the one-character steps are shared by the states of a
// run (a string body's positions follow each other). Not thread-safe: used under the lock of
// grammar/compiled_grammar.h.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "grammar/automaton.h"
#include "grammar/text_class.h"

namespace m3::grammar {

class TextRuns {
 public:
  TextRuns(Automaton& automaton, TextClass cls) : automaton_(automaton), class_(cls) {}

  struct Run {
    bool uniform = false;
    int32_t chars = 0;  // n above, at most kMaxClassChars (then longer texts are not judged)
    // [k - 1]: the largest bytes_to_accept over the states that k characters lead to.
    std::vector<int32_t> max_to_accept;
    std::vector<int32_t> min_to_accept;  // [k - 1]: the smallest
    std::vector<int32_t> ends;  // every state 1..chars characters lead to
  };
  const Run& run(int32_t state);

 private:
  // Beyond this many states after one character (an ambiguous grammar), a state is not uniform.
  static constexpr size_t kMaxStatesPerLevel = 16;
  struct Step {
    enum class Kind { kAllAlive, kAllDead, kMixed } kind = Kind::kMixed;
    std::vector<int32_t> next;  // the states one character leads to (kAllAlive)
  };
  const Step& step(int32_t state);
  Step compute_step(int32_t state);

  Automaton& automaton_;
  TextClass class_;
  std::vector<std::unique_ptr<Step>> steps_;  // by state
  std::vector<std::unique_ptr<Run>> runs_;    // by state
};

}  // namespace m3::grammar
