// The masks of CompiledGrammar (bulk text classes, trie walks, the cache, masks computed ahead)
// against the simplest correct mask (tests/grammar/reference_mask.h) on random specs over a
// random byte-level vocabulary, along random walks, with and without a budget of tokens left.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "grammar/compiled_grammar.h"
#include "grammar/grammar_error.h"
#include "grammar/structured_output.h"
#include "tests/grammar/reference_mask.h"

namespace m3::grammar {
namespace {

using Json = nlohmann::ordered_json;
using Kind = StructuredOutputSpec::Kind;

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// Every single byte, then words, long plain runs (beyond kMaxClassChars), digit runs, JSON
// punctuation, escapes, UTF-8 characters and their fragments, controls and invalid bytes.
std::shared_ptr<const Vocabulary> random_vocabulary(uint64_t seed, size_t size) {
  std::mt19937_64 rng(seed);
  std::vector<std::optional<std::string>> t;
  for (int b = 0; b < 256; ++b) t.push_back(std::string(1, static_cast<char>(b)));
  const std::string letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  static const char* kPieces[] = {"{\"", "\":", "\": ", "\",", "\", \"", "\"}", "},", "}]", "[{", "\"]", "],", ", ", "\\n",
                                  "\\\"", "\\u00e9", "\\u", "\\\\", "\n", "\t", "\x7f", "\xff", "\xc0\x80", "\xed\xa0\x80",
                                  "true", "false", "null", "-", ".", "e+", "@", "_", "+", "0.", ".5", "1,", "\"name\"",
                                  "yes", "no", "maybe so", "admin", "user"};
  auto word = [&](int n) {
    std::string w;
    for (int i = 0; i < n; ++i) w += letters[rng() % letters.size()];
    return w;
  };
  auto character = [&]() -> std::string {
    switch (rng() % 4) {
      case 0: return utf8(0xA0 + static_cast<uint32_t>(rng() % 0x700));
      case 1: return utf8(0x4E00 + static_cast<uint32_t>(rng() % 0x500));
      case 2: return utf8(0x1F600 + static_cast<uint32_t>(rng() % 0x50));
      default: return std::string(1, letters[rng() % letters.size()]);
    }
  };
  while (t.size() < size) {
    std::string s;
    switch (rng() % 10) {
      case 0: case 1: case 2: s = (rng() % 2 ? " " : "") + word(1 + static_cast<int>(rng() % 10)); break;
      case 3: s = word(30 + static_cast<int>(rng() % 12)); break;
      case 4: for (int i = 0, n = 1 + static_cast<int>(rng() % 18); i < n; ++i) s += static_cast<char>('0' + rng() % 10); break;
      case 5: for (int i = 0, n = 1 + static_cast<int>(rng() % 3); i < n; ++i) s += kPieces[rng() % std::size(kPieces)]; break;
      case 6: for (int i = 0, n = 1 + static_cast<int>(rng() % 3); i < n; ++i) s += character(); break;
      case 7: s = character(); s = s.substr(0, 1 + rng() % s.size()); break;  // whole or a fragment
      case 8: s = kPieces[rng() % std::size(kPieces)] + word(1 + static_cast<int>(rng() % 5)); break;
      default: s = word(1 + static_cast<int>(rng() % 4)) + kPieces[rng() % std::size(kPieces)]; break;
    }
    t.push_back(s);
  }
  t.push_back(std::nullopt);   // a special token the client would not see
  t.push_back(std::string());  // an empty token
  t.push_back(std::nullopt);   // eos
  return std::make_shared<const Vocabulary>(t, std::vector<int32_t>{static_cast<int32_t>(t.size()) - 1});
}

Json random_schema(std::mt19937_64& rng, int depth) {
  const int kind = static_cast<int>(rng() % (depth > 0 ? 9 : 6));
  auto len = [&] { return static_cast<int>(rng() % 45); };
  switch (kind) {
    case 0: {
      Json s = {{"type", "string"}};
      if (rng() % 3) s["maxLength"] = len();
      if (rng() % 3 == 0) s["minLength"] = std::min(len() / 4, s.value("maxLength", 40));
      return s;
    }
    case 1: {
      static const char* kFormats[] = {"email", "date", "uuid", "date-time"};
      static const char* kPatterns[] = {"^[a-z]{2,6}$", "^[A-Z][a-z0-9_]*$", "^[0-9]{3}-[0-9]{4}$", "^.{0,12}x$", "^[^\"]{1,40}$"};
      if (rng() % 2) return {{"type", "string"}, {"format", kFormats[rng() % std::size(kFormats)]}};
      return {{"type", "string"}, {"pattern", kPatterns[rng() % std::size(kPatterns)]}};
    }
    case 2: {
      Json s = {{"type", "integer"}};
      if (rng() % 2) s["minimum"] = static_cast<int>(rng() % 50) - 10;
      if (rng() % 2) s["maximum"] = 40 + static_cast<int>(rng() % 5000);
      return s;
    }
    case 3: {
      Json s = {{"type", "number"}};
      if (rng() % 2) s["minimum"] = 0, s["maximum"] = 1 + static_cast<int>(rng() % 100);
      return s;
    }
    case 4: return {{"type", "boolean"}};
    case 5: return {{"enum", Json::array({"admin", "user", "maybe so", "日本", "a\"b"})}};
    case 6: case 7: {
      Json props = Json::object();
      Json required = Json::array();
      for (int i = 0, n = 1 + static_cast<int>(rng() % 3); i < n; ++i) {
        const std::string name = std::string(1, static_cast<char>('a' + i)) + (rng() % 2 ? "name" : "");
        props[name] = random_schema(rng, depth - 1);
        if (rng() % 2) required.push_back(name);
      }
      return {{"type", "object"}, {"properties", props}, {"required", required}, {"additionalProperties", false}};
    }
    default: {
      Json s = {{"type", "array"}, {"items", random_schema(rng, depth - 1)}};
      if (rng() % 2) s["maxItems"] = 1 + static_cast<int>(rng() % 4);
      return s;
    }
  }
}

StructuredOutputSpec random_spec(std::mt19937_64& rng) {
  StructuredOutputSpec s;
  switch (rng() % 6) {
    case 0: case 1: case 2:
      s.kind = Kind::kJsonSchema;
      s.schema = random_schema(rng, 2);
      s.field = "json_schema";
      return s;
    case 3: {
      static const char* kRegexes[] = {R"(\d{4}-\d{2}-\d{2})", R"([a-z]{1,8}@[a-z]{1,8}\.(com|org))", R"((foo|bar)+[0-9]*)",
                                       R"([^\n]{0,30}\.)", R"(.{2,40})", R"([A-Za-z ]{3,20}!)"};
      s.kind = Kind::kRegex;
      s.text = kRegexes[rng() % std::size(kRegexes)];
      s.field = "regex";
      return s;
    }
    case 4:
      s.kind = Kind::kChoice;
      s.choices = {"yes", "no", "maybe so", "日本語", "a much longer choice than the others"};
      s.field = "choice";
      return s;
    default:
      s.kind = Kind::kJsonObject;
      s.field = "json_object";
      return s;
  }
}

TEST(MaskReference, RandomSpecsOverARandomVocabulary) {
  const auto vocab = random_vocabulary(7, 2500);
  std::mt19937_64 rng(11);
  std::vector<uint32_t> words(static_cast<size_t>((vocab->size() + 31) / 32));
  int compiled = 0, compared = 0;
  for (int spec_index = 0; spec_index < 36; ++spec_index) {
    const StructuredOutputSpec spec = random_spec(rng);
    std::unique_ptr<CompiledGrammar> g;
    try {
      // Half with every mask computed on demand, half with masks computed ahead.
      g = std::make_unique<CompiledGrammar>(structured_output_grammar(spec), vocab, spec.field,
                                            spec_index % 2 ? PrecomputeLimits{} : kNoPrecompute);
    } catch (const GrammarError&) {
      continue;  // a random schema may use what the compiler refuses
    }
    ++compiled;
    for (int walk = 0; walk < 2; ++walk) {
      int32_t state = g->start_state();
      for (int step = 0; step < 30; ++step) {
        const int remaining = step % 3 == 0 ? 0 : step % 3 == 1 ? 1 + static_cast<int>(rng() % 12) : 1000;
        std::fill(words.begin(), words.end(), 0u);
        const int64_t count = g->fill_mask(state, words, remaining);
        const std::vector<uint32_t> expected = testing::reference_mask(*g, state, remaining);
        ASSERT_EQ(words, expected) << "spec " << spec_index << " (" << (spec.kind == Kind::kJsonSchema ? spec.schema.dump() : spec.text)
                                   << ") walk " << walk << " step " << step << " remaining " << remaining;
        int64_t bits = 0;
        for (uint32_t w : words) bits += __builtin_popcount(w);
        ASSERT_EQ(count, bits);
        ++compared;
        std::vector<int32_t> ids;
        for (int32_t id = 0; id < vocab->size(); ++id)
          if ((words[static_cast<size_t>(id) >> 5] >> (id & 31)) & 1u) ids.push_back(id);
        ASSERT_FALSE(ids.empty());
        const int32_t pick = ids[rng() % ids.size()];
        if (!vocab->bytes(pick)) break;  // eos
        state = g->advance(state, *vocab->bytes(pick));
        ASSERT_NE(state, Automaton::kDead);
      }
    }
  }
  EXPECT_GE(compiled, 25);
  EXPECT_GE(compared, 1000);
}

// Sequences on several threads while the masks ahead are computed in the background (none at
// construction): the same masks as the reference, whichever computes a state first.
TEST(MaskReference, SequencesRaceTheMasksAhead) {
  const auto vocab = random_vocabulary(13, 2500);
  StructuredOutputSpec spec;
  spec.kind = Kind::kJsonSchema;
  spec.schema = Json::parse(R"({"type":"object","properties":{"name":{"type":"string","maxLength":30},
      "tags":{"type":"array","items":{"type":"string","format":"email"},"maxItems":3},"n":{"type":"integer"},
      "any":{}},"required":["name","n"],"additionalProperties":false})");
  spec.field = "json_schema";
  auto g = std::make_shared<CompiledGrammar>(structured_output_grammar(spec), vocab, spec.field,
                                             PrecomputeLimits{std::chrono::milliseconds(0), std::chrono::milliseconds(10000)});
  std::vector<std::thread> threads;
  std::vector<int> mismatches(3, 0);
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(100 + static_cast<uint64_t>(t));
      std::vector<uint32_t> words(static_cast<size_t>((vocab->size() + 31) / 32));
      for (int walk = 0; walk < 4; ++walk) {
        int32_t state = g->start_state();
        for (int step = 0; step < 25; ++step) {
          const int remaining = step % 2 ? 1000 : 1 + static_cast<int>(rng() % 8);
          g->fill_mask(state, words, remaining);
          if (words != testing::reference_mask(*g, state, remaining)) ++mismatches[static_cast<size_t>(t)];
          std::vector<int32_t> ids;
          for (int32_t id = 0; id < vocab->size(); ++id)
            if ((words[static_cast<size_t>(id) >> 5] >> (id & 31)) & 1u) ids.push_back(id);
          if (ids.empty()) break;
          const int32_t pick = ids[rng() % ids.size()];
          if (!vocab->bytes(pick)) break;
          state = g->advance(state, *vocab->bytes(pick));
          if (state == Automaton::kDead) break;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches, std::vector<int>(3, 0));
  g->wait_precomputed();
  EXPECT_GT(g->cached_masks(), 10u);
}

}  // namespace
}  // namespace m3::grammar
