// A drafter for engine tests that knows each request's reference output and gets about a quarter
// of its guesses wrong (the next id instead), so steps keep every draft, some, or none; past a
// reference's end it guesses token 5.
#pragma once
#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "engine/drafter.h"

namespace m3::test {

class OracleDrafter final : public Drafter {
 public:
  using Known = std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>>;  // (prompt, output)
  OracleDrafter(Known known, int vocab) : vocab_(vocab), known_(std::move(known)) {}
  void propose(std::span<const DraftRequest> requests, std::vector<Draft>& drafts) override {
    drafts.assign(requests.size(), Draft());
    for (size_t i = 0; i < requests.size(); ++i) {
      const std::span<const int32_t> tokens = requests[i].tokens;
      for (const auto& [prompt, output] : known_) {
        if (prompt.size() > tokens.size() || !std::equal(prompt.begin(), prompt.end(), tokens.begin())) continue;
        const size_t done = tokens.size() - prompt.size();
        for (int j = 0; j < requests[i].max_drafts; ++j) {
          const size_t at = done + static_cast<size_t>(j);
          int32_t t = at < output.size() ? output[at] : 5;
          if (mix(at * 31 + tokens.size() * 7 + prompt.size()) % 4 == 0) t = (t + 1) % vocab_;
          drafts[i].tokens.push_back(t);
        }
        break;
      }
    }
  }

 private:
  static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }
  int vocab_;
  Known known_;
};

}  // namespace m3::test
