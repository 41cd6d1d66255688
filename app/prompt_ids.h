// Parsing of --prompt-ids ("5,17,42") shared by generate and score.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace m3::app {

// "5,17,42" (spaces allowed) -> ids; each in [0, vocab_size). Throws m3::Error naming the entry.
std::vector<int32_t> parse_prompt_ids(const std::string& text, int vocab_size);

}  // namespace m3::app
