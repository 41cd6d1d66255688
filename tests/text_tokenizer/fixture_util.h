// Fixture access for the tokenizer tests: the directories tools/make_tokenizer_golden.py wrote
// (tests run from the repository root).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace m3::text::testing {

inline const std::filesystem::path kFixtureRoot = "tests/text_tokenizer/fixtures";

// Every fixture the golden script writes; a missing one fails the tests.
inline const std::vector<std::string> kGoldenFixtures = {
    "gpt2", "gpt2_prefix_nfkc_lower", "cl100k_style", "qwen2_style", "split_behaviors",
    "llama_byte_fallback", "tiny", "minimax_bundled", "regex_classes", "literal_patterns",
    "replace_normalizers", "roberta_post", "no_decoder", "strip_replace_decoder", "unk_fused",
    "unk_not_fused", "unknown_dropped", "added_edge_cases", "affixes",
};

nlohmann::json read_json(const std::filesystem::path& path);
std::string read_text(const std::filesystem::path& path);
// The input of a golden case: "text", or the raw bytes of "hex".
std::string case_input(const nlohmann::json& golden_case);
bool is_valid_utf8(const std::string& bytes);

}  // namespace m3::text::testing
