// structured_mask_bench: the cost of structured-output token masks per generated token, at a
// 200K-token byte-level vocabulary synthesized deterministically (single bytes, pseudo-words
// with and without a leading space, digit groups, JSON punctuation runs, whitespace runs, UTF-8
// characters and their fragments), for common specs. Each sequence picks random tokens within the
// masks (a model's choices, minus the model); the time of fill_allowed + accept is measured per
// token. Per spec:
//   compile: building the CompiledGrammar, the masks it computes at construction included;
//   cold:    the first sequence, started right after (the masks computed ahead in the background
//            are then still being computed: it takes what is there and computes the rest);
//   ahead:   how long the background took to finish computing masks ahead, from construction;
//   warm:    the following sequences (the server keeps compiled grammars, so repeated schemas
//            are warm), once the masks ahead are done; "cpu p99" is their p99 of the thread's
//            CPU time (fill_allowed and accept), without the time the thread was not
//            running (a loaded machine's preemptions).
//   structured_mask_bench [--vocab 200000] [--sequences 20] [--tokens 200] [--lazy] [--cold-step-ms 0]
//                         [--first-use-wait-ms 0]
// --first-use-wait-ms: before the first sequence, wait up to this long for the masks ahead, as
// the server does for a new spec (server/constraint_compiler.h kFirstUseWait: 2000); the "wait"
// column is that wait, part of the first request's time to first token.
// --lazy computes no mask ahead (every mask on first use). --cold-step-ms: the first sequence
// waits this long after each token, as it would for the model's forward pass (the masks ahead
// use that time; the default, no wait, is the worst case).
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "grammar/compiled_grammar.h"
#include "grammar/grammar_constraint.h"
#include "grammar/structured_output.h"
#include "grammar/tool_call_grammar.h"

namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

std::vector<std::optional<std::string>> synthetic_vocab(size_t size) {
  std::mt19937_64 rng(12345);
  std::set<std::string> seen;
  std::vector<std::optional<std::string>> out;
  auto add = [&](std::string s) {
    if (!s.empty() && out.size() < size && seen.insert(s).second) out.push_back(std::move(s));
  };
  for (int b = 0; b < 256; ++b) add(std::string(1, static_cast<char>(b)));
  static const char* kPunct[] = {"{\"", "\":", "\": ", "\",", "\", \"", "\"}", "},", "}]", "[{", "\":\"", "\"]", "],",
                                 "\n", "\n\n", "  ", "    ", ".", ",", ":", ";", "!", "?", "()", "{}", "[]", "//", "->",
                                 "==", "\\n", "\\\"", "'s", "...", " -", " (", ")."};
  for (const char* p : kPunct) add(p);
  for (int n = 2; n <= 16; ++n) add(std::string(size_t(n), ' ')), add("\n" + std::string(size_t(n), ' '));
  for (int d = 0; d < 1000; ++d) add(std::to_string(d)), add(" " + std::to_string(d));
  const std::string consonants = "bcdfghjklmnprstvwz", vowels = "aeiou";
  while (out.size() < size) {
    const int kind = static_cast<int>(rng() % 10);
    if (kind < 7) {
      std::string w;
      const int syllables = 1 + static_cast<int>(rng() % 4);
      for (int i = 0; i < syllables; ++i) {
        w += consonants[rng() % consonants.size()];
        w += vowels[rng() % vowels.size()];
        if (rng() % 3 == 0) w += consonants[rng() % consonants.size()];
      }
      if (rng() % 5 == 0) w[0] = static_cast<char>(w[0] - 32);
      add(rng() % 2 ? " " + w : w);
    } else if (kind == 7) {
      // A CJK or accented character, whole or its first bytes.
      const uint32_t cp = rng() % 2 ? 0x4E00 + static_cast<uint32_t>(rng() % 0x5000) : 0xC0 + static_cast<uint32_t>(rng() % 0x140);
      std::string s;
      if (cp < 0x800) {
        s += static_cast<char>(0xC0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3F));
      } else {
        s += static_cast<char>(0xE0 | (cp >> 12));
        s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        s += static_cast<char>(0x80 | (cp & 0x3F));
      }
      add(rng() % 4 == 0 ? s.substr(0, s.size() - 1) : s);
    } else if (kind == 8) {
      std::string s;
      for (int i = 0, n = 2 + static_cast<int>(rng() % 3); i < n; ++i) s += kPunct[rng() % (sizeof(kPunct) / sizeof(*kPunct))];
      add(s);
    } else {
      add(std::to_string(rng() % 100000));
    }
  }
  return out;
}

struct Case {
  std::string name;
  m3::grammar::StructuredOutputSpec spec;
  Json tools;  // not null: the M3 tool-call markup for these tools instead of `spec`
};

m3::grammar::Grammar grammar_of(const Case& c) {
  if (c.tools.is_null()) return m3::grammar::structured_output_grammar(c.spec);
  m3::grammar::ToolCallGrammarOptions o;
  o.namespace_marker = "]<]minimax[>[";
  return m3::grammar::tool_call_grammar(c.tools, "", o);
}

std::vector<Case> cases() {
  using Kind = m3::grammar::StructuredOutputSpec::Kind;
  std::vector<Case> out;
  auto schema = [&](std::string name, const char* text) {
    Case c{std::move(name), {}};
    c.spec.kind = Kind::kJsonSchema;
    c.spec.schema = Json::parse(text);
    c.spec.field = "json_schema";
    out.push_back(std::move(c));
  };
  schema("person object", R"({"type":"object","properties":{"name":{"type":"string","maxLength":40},
      "age":{"type":"integer","minimum":0,"maximum":150},"email":{"type":"string","format":"email"},
      "tags":{"type":"array","items":{"enum":["admin","user","guest"]},"maxItems":5},
      "address":{"type":"object","properties":{"street":{"type":"string","maxLength":60},"city":{"type":"string","maxLength":30},
      "zip":{"type":"string","pattern":"^[0-9]{5}$"}},"required":["city"],"additionalProperties":false}},
      "required":["name","age"],"additionalProperties":false})");
  schema("tool arguments", R"({"type":"object","properties":{"query":{"type":"string"},"limit":{"type":"integer","minimum":1,"maximum":100},
      "sort":{"enum":["asc","desc"]},"include_archived":{"type":"boolean"}},"required":["query"],"additionalProperties":false})");
  schema("array of records", R"({"type":"array","items":{"type":"object","properties":{"id":{"type":"integer"},
      "score":{"type":"number","minimum":0,"maximum":1},"label":{"type":"string","maxLength":20}},"required":["id","score","label"],
      "additionalProperties":false},"maxItems":8})");
  Case obj{"json_object", {}};
  obj.spec.kind = Kind::kJsonObject;
  obj.spec.field = "json_object";
  out.push_back(obj);
  schema("enum", R"({"enum":["pending","in_progress","completed","cancelled","failed"]})");
  auto regex = [&](std::string name, const char* text) {
    Case c{std::move(name), {}};
    c.spec.kind = Kind::kRegex;
    c.spec.text = text;
    c.spec.field = "regex";
    out.push_back(std::move(c));
  };
  regex("regex date", R"(\d{4}-\d{2}-\d{2}( [0-2]\d:[0-5]\d)?)");
  regex("regex email", R"([a-z0-9._]{1,20}@[a-z0-9]{1,20}\.(com|org|net))");
  Case choice{"choice", {}};
  choice.spec.kind = Kind::kChoice;
  choice.spec.choices = {"positive", "negative", "neutral", "mixed feelings"};
  choice.spec.field = "choice";
  out.push_back(choice);
  Case call{"tool-call markup", {}, Json::parse(R"([{"type":"function","function":{"name":"search_flights",
      "parameters":{"type":"object","properties":{"origin":{"type":"string"},"destination":{"type":"string"},
      "date":{"type":"string","format":"date"},"passengers":{"type":"integer","minimum":1,"maximum":9},
      "cabin":{"enum":["economy","business","first"]}},"required":["origin","destination","date"]}}},
      {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
      "city":{"type":"string"},"unit":{"enum":["celsius","fahrenheit"]}},"required":["city"]}}}])")};
  out.push_back(call);
  return out;
}

double thread_cpu_us() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  size_t vocab_size = 200000;
  int sequences = 20, tokens = 200;
  bool lazy = false;
  int cold_step_ms = 0;
  int first_use_wait_ms = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--lazy") lazy = true;
    else if (i + 1 >= argc) break;
    else if (a == "--vocab") vocab_size = std::stoul(argv[++i]);
    else if (a == "--sequences") sequences = std::stoi(argv[++i]);
    else if (a == "--tokens") tokens = std::stoi(argv[++i]);
    else if (a == "--cold-step-ms") cold_step_ms = std::stoi(argv[++i]);
    else if (a == "--first-use-wait-ms") first_use_wait_ms = std::stoi(argv[++i]);
  }
  auto t0 = Clock::now();
  auto bytes = synthetic_vocab(vocab_size);
  bytes.push_back(std::nullopt);  // eos
  const int32_t eos = static_cast<int32_t>(bytes.size() - 1);
  auto vocab = std::make_shared<const m3::grammar::Vocabulary>(bytes, std::vector<int32_t>{eos});
  std::printf("vocabulary: %zu tokens, %zu trie nodes, built in %.0f ms\n", bytes.size(), vocab->trie().nodes().size(),
              std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  std::printf("%-16s %7s %9s %9s %9s %9s %9s %7s %6s %9s %9s %9s %9s\n", "spec", "tokens", "compile", "wait", "cold p50", "cold p99",
              "ahead", "masks", "MB", "warm p50", "warm p99", "warm max", "cpu p99");
  auto texts = std::make_shared<std::vector<std::string>>();
  std::vector<uint32_t> words(static_cast<size_t>(m3::token_mask_words(vocab->size())));
  // The pick's list, kept across sequences: growing it anew each time would map and unmap
  // memory beside the timed calls.
  std::vector<int32_t> allowed;
  allowed.reserve(static_cast<size_t>(vocab->size()));
  for (const Case& c : cases()) {
    const auto built = Clock::now();
    auto g = std::make_shared<m3::grammar::CompiledGrammar>(grammar_of(c), vocab, c.name,
                                                            lazy ? m3::grammar::kNoPrecompute : m3::grammar::PrecomputeLimits{});
    const double compile_ms = std::chrono::duration<double, std::milli>(Clock::now() - built).count();
    const auto compiled = Clock::now();
    if (first_use_wait_ms > 0) g->wait_precomputed_for(std::chrono::milliseconds(first_use_wait_ms));
    const double wait_ms = std::chrono::duration<double, std::milli>(Clock::now() - compiled).count();
    std::vector<double> cold, warm, warm_cpu;
    size_t total = 0;
    double ahead_ms = 0.0;
    for (int s = 0; s < sequences; ++s) {
      if (s == 1) {
        g->wait_precomputed();
        ahead_ms = std::chrono::duration<double, std::milli>(Clock::now() - built).count();
      }
      m3::grammar::GrammarConstraint con(g, texts, "");
      std::mt19937_64 rng(static_cast<uint64_t>(s) + 1);
      for (int t = 0; t < tokens && !con.terminated(); ++t) {
        const double cpu0 = thread_cpu_us();
        const auto a = Clock::now();
        con.fill_allowed(words, tokens - t);
        const auto b = Clock::now();
        const double cpu1 = thread_cpu_us();
        allowed.clear();  // the pick stands in for the sampler: not timed
        for (size_t w = 0; w < words.size(); ++w)
          for (uint32_t bits = words[w]; bits; bits &= bits - 1) allowed.push_back(static_cast<int32_t>(w * 32 + __builtin_ctz(bits)));
        const int32_t pick = allowed[rng() % allowed.size()];
        const double cpu2 = thread_cpu_us();
        const auto c0 = Clock::now();
        if (!con.accept(pick)) {
          std::printf("refused an allowed token\n");
          return 1;
        }
        const auto d = Clock::now();
        const double us = std::chrono::duration<double, std::micro>((b - a) + (d - c0)).count();
        (s == 0 ? cold : warm).push_back(us);
        if (s > 0) warm_cpu.push_back((cpu1 - cpu0) + (thread_cpu_us() - cpu2));
        ++total;
        if (pick == eos) break;
        if (s == 0 && cold_step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(cold_step_ms));
      }
    }
    std::printf("%-16s %7zu %7.1fms %7.0fms %7.1fus %7.1fus %7.0fms %7zu %6.1f %7.1fus %7.1fus %7.1fus %7.1fus\n",
                c.name.c_str(), total, compile_ms, wait_ms, percentile(cold, 0.5), percentile(cold, 0.99), ahead_ms, g->cached_masks(),
                static_cast<double>(g->cached_mask_bytes()) / (1 << 20), percentile(warm, 0.5),
                percentile(warm, 0.99), percentile(warm, 1.0), percentile(warm_cpu, 0.99));
    std::fflush(stdout);
  }
  return 0;
}
