// structured_mask_bench: the cost of structured-output token masks per generated token, at a
// 200K-token byte-level vocabulary synthesized deterministically (single bytes, pseudo-words
// with and without a leading space, digit groups, JSON punctuation runs, whitespace runs, UTF-8
// characters and their fragments), for common specs. Each sequence picks random tokens within the
// masks (a model's choices, minus the model); the time of fill_allowed + accept is measured per
// token. "cold" is the first sequence of a spec (every state's mask computed for the first time),
// "warm" the following ones (the server keeps compiled grammars, so repeated schemas are warm).
//   structured_mask_bench [--vocab 200000] [--sequences 20] [--tokens 200]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "grammar/compiled_grammar.h"
#include "grammar/grammar_constraint.h"
#include "grammar/structured_output.h"

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
};

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
  Case re{"regex date", {}};
  re.spec.kind = Kind::kRegex;
  re.spec.text = R"(\d{4}-\d{2}-\d{2}( [0-2]\d:[0-5]\d)?)";
  re.spec.field = "regex";
  out.push_back(re);
  return out;
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
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--vocab") vocab_size = std::stoul(argv[i + 1]);
    else if (a == "--sequences") sequences = std::stoi(argv[i + 1]);
    else if (a == "--tokens") tokens = std::stoi(argv[i + 1]);
  }
  auto t0 = Clock::now();
  auto bytes = synthetic_vocab(vocab_size);
  bytes.push_back(std::nullopt);  // eos
  const int32_t eos = static_cast<int32_t>(bytes.size() - 1);
  auto vocab = std::make_shared<const m3::grammar::Vocabulary>(bytes, std::vector<int32_t>{eos});
  std::printf("vocabulary: %zu tokens, %zu trie nodes, built in %.0f ms\n", bytes.size(), vocab->trie().nodes().size(),
              std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  std::printf("%-18s %8s %10s %10s %10s %10s %10s\n", "spec", "tokens", "cold p50", "cold p99", "warm p50", "warm p99",
              "warm max");
  auto texts = std::make_shared<std::vector<std::string>>();
  std::vector<uint32_t> words(static_cast<size_t>(m3::token_mask_words(vocab->size())));
  for (const Case& c : cases()) {
    auto g = std::make_shared<m3::grammar::CompiledGrammar>(m3::grammar::structured_output_grammar(c.spec), vocab, c.name);
    std::vector<double> cold, warm;
    size_t total = 0;
    for (int s = 0; s < sequences; ++s) {
      m3::grammar::GrammarConstraint con(g, texts, "");
      std::mt19937_64 rng(static_cast<uint64_t>(s) + 1);
      std::vector<int32_t> allowed;
      for (int t = 0; t < tokens && !con.terminated(); ++t) {
        const auto a = Clock::now();
        con.fill_allowed(words, tokens - t);
        const auto b = Clock::now();
        allowed.clear();  // the pick stands in for the sampler: not timed
        for (size_t w = 0; w < words.size(); ++w)
          for (uint32_t bits = words[w]; bits; bits &= bits - 1) allowed.push_back(static_cast<int32_t>(w * 32 + __builtin_ctz(bits)));
        const int32_t pick = allowed[rng() % allowed.size()];
        const auto c0 = Clock::now();
        if (!con.accept(pick)) {
          std::printf("refused an allowed token\n");
          return 1;
        }
        const auto d = Clock::now();
        const double us = std::chrono::duration<double, std::micro>((b - a) + (d - c0)).count();
        (s == 0 ? cold : warm).push_back(us);
        ++total;
        if (pick == eos) break;
      }
    }
    std::printf("%-18s %8zu %8.1fus %8.1fus %8.1fus %8.1fus %8.1fus\n", c.name.c_str(), total, percentile(cold, 0.5),
                percentile(cold, 0.99), percentile(warm, 0.5), percentile(warm, 0.99), percentile(warm, 1.0));
  }
  return 0;
}
