#include "server/openai_response.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <random>

namespace m3::server {

std::string make_response_id(std::string_view prefix) {
  // One generator per HTTP worker thread: ids need uniqueness, not secrecy.
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}{:016x}{:016x}", prefix, rng(), rng());
}

int64_t unix_time_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string dump_json(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string sse_event(const nlohmann::json& value) {
  std::string event = "data: ";
  event += dump_json(value);
  event += "\n\n";
  return event;
}

nlohmann::json usage_json(int64_t prompt_tokens, int64_t completion_tokens, std::optional<int64_t> cached_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", cached_tokens ? nlohmann::json{{"cached_tokens", *cached_tokens}}
                                                  : nlohmann::json(nullptr)}};
}

std::string TokenStrings::text(int32_t id) const {
  const int32_t ids[] = {id};
  return tokenizer_.decode(ids, /*skip_special_tokens=*/false);
}

double json_logprob(float logprob) {
  return std::isfinite(logprob) ? static_cast<double>(logprob) : -9999.0;
}

namespace {

// Offsets count characters, as Python's len() of the text does for vLLM.
int64_t code_points(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

nlohmann::json byte_list(const std::string& s) {
  nlohmann::json bytes = nlohmann::json::array();
  for (unsigned char c : s) bytes.push_back(static_cast<int>(c));
  return bytes;
}

}  // namespace

nlohmann::json chat_logprob_entries(const std::vector<PositionLogprobs>& positions,
                                    const TokenStrings& strings, int top_k) {
  nlohmann::json entries = nlohmann::json::array();
  for (const PositionLogprobs& p : positions) {
    std::string token = strings.text(p.token_id);
    nlohmann::json top = nlohmann::json::array();
    for (size_t i = 0; i < p.top.size() && static_cast<int>(i) < top_k; ++i) {
      std::string alt = strings.text(p.top[i].token_id);
      top.push_back(
          {{"token", alt}, {"logprob", json_logprob(p.top[i].logprob)}, {"bytes", byte_list(alt)}});
    }
    entries.push_back({{"token", token},
                       {"logprob", json_logprob(p.logprob)},
                       {"bytes", byte_list(token)},
                       {"top_logprobs", std::move(top)}});
  }
  return entries;
}

void CompletionLogprobs::add_unscored(int32_t token_id) {
  std::string token = strings_.text(token_id);
  lengths_.push_back(code_points(token));
  text_length_ += lengths_.back();
  tokens_.push_back(std::move(token));
  token_logprobs_.push_back(nullptr);
  top_logprobs_.push_back(nullptr);
}

void CompletionLogprobs::add(const PositionLogprobs& position) {
  std::string token = strings_.text(position.token_id);
  lengths_.push_back(code_points(token));
  text_length_ += lengths_.back();
  // vLLM's top_logprobs dict holds the top k plus the sampled token itself.
  nlohmann::json top = nlohmann::json::object();
  for (size_t i = 0; i < position.top.size() && static_cast<int>(i) < top_k_; ++i) {
    top[strings_.text(position.top[i].token_id)] = json_logprob(position.top[i].logprob);
  }
  top[token] = json_logprob(position.logprob);
  tokens_.push_back(std::move(token));
  token_logprobs_.push_back(json_logprob(position.logprob));
  top_logprobs_.push_back(std::move(top));
}

nlohmann::json CompletionLogprobs::take(int64_t text_offset_base) {
  nlohmann::json offsets = nlohmann::json::array();
  int64_t offset = text_offset_base;
  for (int64_t length : lengths_) {
    offsets.push_back(offset);
    offset += length;
  }
  nlohmann::json out = {{"text_offset", std::move(offsets)},
                        {"token_logprobs", std::move(token_logprobs_)},
                        {"tokens", std::move(tokens_)},
                        {"top_logprobs", std::move(top_logprobs_)}};
  tokens_ = nlohmann::json::array();
  token_logprobs_ = nlohmann::json::array();
  top_logprobs_ = nlohmann::json::array();
  lengths_.clear();
  return out;
}

nlohmann::json prompt_logprobs_json(const std::vector<PositionLogprobs>& positions,
                                    const TokenStrings& strings) {
  nlohmann::json out = nlohmann::json::array();
  out.push_back(nullptr);
  for (const PositionLogprobs& p : positions) {
    nlohmann::json entry = nlohmann::json::object();
    entry[std::to_string(p.token_id)] = {{"logprob", json_logprob(p.logprob)},
                                         {"rank", p.rank},
                                         {"decoded_token", strings.text(p.token_id)}};
    for (const TokenLogprob& alt : p.top) {
      std::string key = std::to_string(alt.token_id);
      if (entry.contains(key)) continue;
      int rank = static_cast<int>(&alt - p.top.data()) + 1;
      entry[key] = {{"logprob", json_logprob(alt.logprob)},
                    {"rank", rank},
                    {"decoded_token", strings.text(alt.token_id)}};
    }
    out.push_back(std::move(entry));
  }
  return out;
}

}  // namespace m3::server
