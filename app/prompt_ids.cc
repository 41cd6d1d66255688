#include "app/prompt_ids.h"

#include <sstream>

#include "core/error.h"

namespace m3::app {

std::vector<int32_t> parse_prompt_ids(const std::string& text, int vocab_size) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto b = item.find_first_not_of(" \t");
    const auto e = item.find_last_not_of(" \t");
    M3_CHECK(b != std::string::npos, "--prompt-ids: empty entry {} in '{}'", ids.size(), text);
    const std::string tok = item.substr(b, e - b + 1);
    std::size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(tok, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    M3_CHECK(used == tok.size(), "--prompt-ids: '{}' is not an integer", tok);
    M3_CHECK(v >= 0 && v < vocab_size, "--prompt-ids: id {} outside the vocabulary [0, {})", v, vocab_size);
    ids.push_back(static_cast<int32_t>(v));
  }
  M3_CHECK(!ids.empty(), "--prompt-ids is empty");
  return ids;
}

}  // namespace m3::app
