// Feeding parsers in chosen chunkings and assembling what they stream, checking the delta
// contract on the way (ids and names on a call's first delta only, indices in order).
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/reasoning_parser.h"
#include "text/tool_parser.h"

namespace m3::text::testing {

inline const std::string kNs = "]<]minimax[>[";

// Ids "call_0", "call_1", ... so that two runs over the same text produce the same ids.
inline ToolCallIdGenerator counting_ids() {
  auto next = std::make_shared<int>(0);
  return [next] { return "call_" + std::to_string((*next)++); };
}

struct Chunking {
  std::string label;
  std::vector<std::string> chunks;
};

inline std::vector<std::string> split_at(const std::string& text, const std::vector<std::size_t>& cuts) {
  std::vector<std::string> chunks;
  std::size_t begin = 0;
  for (std::size_t cut : cuts) {
    chunks.push_back(text.substr(begin, cut - begin));
    begin = cut;
  }
  chunks.push_back(text.substr(begin));
  return chunks;
}

// One byte at a time, every split into two pieces, and random splits (fixed seeds) with small
// and large pieces, some of them empty.
inline std::vector<Chunking> all_chunkings(const std::string& text) {
  std::vector<Chunking> out;
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  out.push_back({"one byte at a time", bytes});
  for (std::size_t i = 1; i < text.size(); ++i) out.push_back({"split at " + std::to_string(i), split_at(text, {i})});
  for (std::uint32_t seed = 1; seed <= 40; ++seed) {
    std::mt19937 rng(seed);
    const std::size_t max_piece = seed % 2 ? 6 : 48;
    std::uniform_int_distribution<std::size_t> piece(0, max_piece);
    std::vector<std::size_t> cuts;
    for (std::size_t at = piece(rng); at < text.size(); at += piece(rng)) cuts.push_back(at);
    out.push_back({"random seed " + std::to_string(seed), split_at(text, cuts)});
  }
  return out;
}

// Streams `chunks` through a fresh tool parser and assembles the message, as a client would.
inline ToolParseResult stream_tool_calls(const std::string& parser_name, const nlohmann::json& tools,
                                         const std::vector<std::string>& chunks) {
  ToolCallParser parser(parser_name, tools, counting_ids());
  ToolParseResult result;
  auto take = [&](const ToolStreamDelta& delta) {
    result.content += delta.content_delta;
    int last_index = -1;
    for (const ToolCallDelta& d : delta.tool_call_deltas) {
      EXPECT_GT(d.index, last_index) << "one delta per call and feed, in index order";
      last_index = d.index;
      const bool first = d.index == static_cast<int>(result.tool_calls.size());
      EXPECT_EQ(d.id.has_value(), first) << "id only on a call's first delta";
      EXPECT_EQ(d.name.has_value(), first) << "name only on a call's first delta";
      if (first) {
        result.tool_calls.push_back({d.id.value_or(""), d.name.value_or(""), {}, true});
      }
      EXPECT_LT(d.index, static_cast<int>(result.tool_calls.size())) << "deltas for a call not yet started";
      if (d.index < static_cast<int>(result.tool_calls.size())) result.tool_calls[d.index].arguments += d.arguments_delta;
    }
  };
  for (const std::string& chunk : chunks) take(parser.feed(chunk));
  take(parser.finish());
  EXPECT_EQ(parser.saw_tool_call(), !result.tool_calls.empty());
  return result;
}

inline ReasoningSplit stream_reasoning(const std::string& parser_name, const ReasoningOptions& options,
                                       const std::vector<std::string>& chunks) {
  ReasoningParser parser(parser_name, options);
  ReasoningSplit split;
  for (const std::string& chunk : chunks) {
    const DeltaMessage d = parser.feed(chunk);
    split.reasoning += d.reasoning_delta;
    split.content += d.content_delta;
  }
  const DeltaMessage d = parser.finish();
  split.reasoning += d.reasoning_delta;
  split.content += d.content_delta;
  return split;
}

}  // namespace m3::text::testing
