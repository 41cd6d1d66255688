#include "grammar/text_runs.h"

#include <algorithm>


namespace m3::grammar {
namespace {

void add_unique(std::vector<int32_t>& set, int32_t state) {
  if (std::find(set.begin(), set.end(), state) == set.end()) set.push_back(state);
}

}  // namespace

TextRuns::Step TextRuns::compute_step(int32_t state) {
  Step out;
  bool any_dead = false, any_alive = false;
  std::vector<int32_t> frontier, next;
  for (const CharShape& shape : char_shapes(class_)) {
    frontier.assign(1, state);
    for (int32_t k = 0; k < shape.length && !frontier.empty(); ++k) {
      next.clear();
      for (int32_t u : frontier) {
        for (int b = shape.bytes[k].lo; b <= shape.bytes[k].hi; ++b) {
          const int32_t v = automaton_.next(u, static_cast<uint8_t>(b));
          if (v == Automaton::kDead) {
            any_dead = true;
          } else {
            add_unique(next, v);
            if (next.size() > kMaxStatesPerLevel) return out;  // kMixed: too ambiguous to follow
          }
        }
        if (any_dead && any_alive) return out;
      }
      frontier.swap(next);
    }
    for (int32_t v : frontier) add_unique(out.next, v);
    any_alive = any_alive || !frontier.empty();
    if ((any_dead && any_alive) || out.next.size() > kMaxStatesPerLevel) {
      out.next.clear();
      return out;
    }
  }
  out.kind = any_alive ? Step::Kind::kAllAlive : Step::Kind::kAllDead;
  return out;
}

const TextRuns::Step& TextRuns::step(int32_t state) {
  const auto i = static_cast<size_t>(state);
  if (steps_.size() <= i) steps_.resize(i + 1);
  if (!steps_[i]) steps_[i] = std::make_unique<Step>(compute_step(state));
  return *steps_[i];
}

const TextRuns::Run& TextRuns::run(int32_t state) {
  const auto i = static_cast<size_t>(state);
  if (runs_.size() <= i) runs_.resize(i + 1);
  if (runs_[i]) return *runs_[i];
  auto r = std::make_unique<Run>();
  std::vector<int32_t> level = {state}, next;
  for (int32_t k = 0;; ++k) {
    if (k == kMaxClassChars) {
      r->uniform = true;
      r->chars = k;
      break;
    }
    bool all_dead = true, all_alive = true;
    next.clear();
    for (int32_t t : level) {
      const Step& s = step(t);
      all_dead = all_dead && s.kind == Step::Kind::kAllDead;
      all_alive = all_alive && s.kind == Step::Kind::kAllAlive;
      if (s.kind == Step::Kind::kAllAlive)
        for (int32_t v : s.next) add_unique(next, v);
    }
    if (all_dead) {
      r->uniform = true;
      r->chars = k;
      break;
    }
    if (!all_alive || next.size() > kMaxStatesPerLevel) break;  // not uniform
    int32_t worst = 0, nearest = Nfa::kUnreachable;
    for (int32_t v : next) {
      worst = std::max(worst, automaton_.bytes_to_accept(v));
      nearest = std::min(nearest, automaton_.bytes_to_accept(v));
      r->ends.push_back(v);
    }
    r->max_to_accept.push_back(worst);
    r->min_to_accept.push_back(nearest);
    level.swap(next);
  }
  if (!r->uniform) r->max_to_accept.clear(), r->min_to_accept.clear(), r->ends.clear();
  std::sort(r->ends.begin(), r->ends.end());
  r->ends.erase(std::unique(r->ends.begin(), r->ends.end()), r->ends.end());
  runs_[i] = std::move(r);
  return *runs_[i];
}

}  // namespace m3::grammar
