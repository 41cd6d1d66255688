#include <gtest/gtest.h>

#include <random>

#include "grammar/compiled_grammar.h"
#include "grammar/grammar_constraint.h"
#include "grammar/grammar_error.h"
#include "grammar/structured_output.h"
#include "tests/grammar/test_vocab.h"

namespace m3::grammar {
namespace {

using Json = nlohmann::ordered_json;
using Kind = StructuredOutputSpec::Kind;

std::shared_ptr<CompiledGrammar> compile(const StructuredOutputSpec& spec) {
  return std::make_shared<CompiledGrammar>(structured_output_grammar(spec), testing::test_vocabulary(), spec.field);
}

StructuredOutputSpec schema_spec(const Json& schema) {
  StructuredOutputSpec s;
  s.kind = Kind::kJsonSchema;
  s.schema = schema;
  s.field = "json_schema";
  return s;
}

bool allowed(const std::vector<uint32_t>& words, int32_t id) { return (words[id >> 5] >> (id & 31)) & 1u; }

// Random tokens within the mask until the constraint ends (or the budget runs out): the text.
std::optional<std::string> random_walk(const std::shared_ptr<CompiledGrammar>& g, uint64_t seed, int budget) {
  GrammarConstraint c(g, std::make_shared<std::vector<std::string>>(), "");
  const Vocabulary& v = g->vocabulary();
  std::vector<uint32_t> words((v.size() + 31) / 32);
  std::mt19937_64 rng(seed);
  std::string text;
  for (int step = 0; step < budget; ++step) {
    if (c.terminated()) return text;
    EXPECT_TRUE(c.fill_allowed(words, budget - step));
    std::vector<int32_t> ids;
    for (int32_t i = 0; i < v.size(); ++i)
      if (allowed(words, i)) ids.push_back(i);
    EXPECT_FALSE(ids.empty());
    const int32_t pick = ids[rng() % ids.size()];
    EXPECT_TRUE(c.accept(pick));
    if (v.bytes(pick)) text += *v.bytes(pick);
    else return text;  // eos
  }
  return c.terminated() ? std::optional<std::string>(text) : std::nullopt;
}

TEST(Grammar, ChoiceAllowsExactlyTheChoices) {
  StructuredOutputSpec s;
  s.kind = Kind::kChoice;
  s.choices = {"yes", "no", "maybe so"};
  s.field = "choice";
  auto g = compile(s);
  for (uint64_t seed = 0; seed < 50; ++seed) {
    auto text = random_walk(g, seed, 64);
    ASSERT_TRUE(text);
    EXPECT_TRUE(*text == "yes" || *text == "no" || *text == "maybe so") << *text;
  }
}

TEST(Grammar, JsonSchemaWalksGiveValidShapes) {
  Json schema = Json::parse(R"({"type":"object","properties":{"name":{"type":"string","maxLength":5},
      "age":{"type":"integer","minimum":0,"maximum":120},"ok":{"type":"boolean"}},"required":["name","age"],
      "additionalProperties":false})");
  auto g = compile(schema_spec(schema));
  for (uint64_t seed = 0; seed < 100; ++seed) {
    auto text = random_walk(g, seed, 200);
    ASSERT_TRUE(text) << seed;
    Json v = Json::parse(*text);
    ASSERT_TRUE(v.is_object()) << *text;
    EXPECT_TRUE(v["name"].is_string());
    EXPECT_LE(v["name"].get<std::string>().size(), 5u * 4);
    EXPECT_GE(v["age"].get<int>(), 0);
    EXPECT_LE(v["age"].get<int>(), 120);
  }
}

TEST(Grammar, UnsupportedKeywordNamesIt) {
  try {
    compile(schema_spec(Json::parse(R"({"type":"object","properties":{"a":{"type":"number","multipleOf":3}}})")));
    FAIL();
  } catch (const GrammarError& e) {
    EXPECT_EQ(e.keyword(), "json_schema.properties.a.multipleOf") << e.what();
  }
}

TEST(Grammar, LeftRecursionIsRefused) {
  StructuredOutputSpec s;
  s.kind = Kind::kGrammar;
  s.text = "root ::= root \"a\" | \"b\"";
  s.field = "grammar";
  EXPECT_THROW(compile(s), GrammarError);
}

TEST(Grammar, EbnfNestedBrackets) {
  StructuredOutputSpec s;
  s.kind = Kind::kGrammar;
  s.text = "root ::= item (\",\" item)*\nitem ::= \"[\" root? \"]\" | [a-c]+\n";
  s.field = "grammar";
  auto g = compile(s);
  int done = 0;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    auto text = random_walk(g, seed, 400);
    if (!text) continue;
    ++done;
    int depth = 0;
    for (char c : *text) {
      depth += c == '[' ? 1 : c == ']' ? -1 : 0;
      ASSERT_GE(depth, 0) << *text;
    }
    EXPECT_EQ(depth, 0) << *text;
  }
  EXPECT_GT(done, 40);
}

TEST(Grammar, RollbackRestoresTheState) {
  auto g = compile(schema_spec(Json::parse(R"({"type":"array","items":{"type":"integer"}})")));
  GrammarConstraint c(g, std::make_shared<std::vector<std::string>>(), "");
  const int32_t open = '[', one = '1', comma = ',';
  std::vector<uint32_t> before((g->vocabulary().size() + 31) / 32), after(before.size());
  ASSERT_TRUE(c.accept(open));
  c.fill_allowed(before, 100);
  ASSERT_TRUE(c.accept(one));
  ASSERT_TRUE(c.accept(comma));
  c.rollback(2);
  c.fill_allowed(after, 100);
  EXPECT_EQ(before, after);
  EXPECT_FALSE(c.accept(']' + 0 == ']' ? int32_t('}') : 0));
}

TEST(Grammar, StartMarkerWaitsThenForcesItselfNearTheEnd) {
  StructuredOutputSpec s;
  s.kind = Kind::kChoice;
  s.choices = {"yes", "no"};
  s.field = "choice";
  auto g = compile(s);
  const Vocabulary& v = g->vocabulary();
  // Token texts: every token's bytes; token 300 ("]<]") stands in for the end-of-reasoning marker.
  auto texts = std::make_shared<std::vector<std::string>>();
  for (int32_t i = 0; i < v.size(); ++i) texts->push_back(v.bytes(i).value_or(""));
  const int32_t marker = 256 + 19;  // "]<]" in test_token_bytes()
  ASSERT_EQ((*texts)[marker], "]<]");
  GrammarConstraint c(g, texts, "]<]");
  std::vector<uint32_t> words((v.size() + 31) / 32);
  const int32_t eos = v.size() - 1;
  ASSERT_TRUE(c.fill_allowed(words, 100));  // reasoning: anything but eos
  EXPECT_TRUE(allowed(words, 'z'));
  EXPECT_FALSE(allowed(words, eos));
  ASSERT_TRUE(c.accept('z'));
  ASSERT_TRUE(c.fill_allowed(words, 3));  // "yes" needs 2 bytes: now only the marker fits
  for (int32_t i = 0; i < v.size(); ++i) EXPECT_EQ(allowed(words, i), i == marker) << i;
  ASSERT_TRUE(c.accept(marker));
  EXPECT_TRUE(c.active());
  ASSERT_TRUE(c.fill_allowed(words, 2));
  EXPECT_TRUE(allowed(words, 'n'));
  EXPECT_FALSE(allowed(words, 'z'));
  ASSERT_TRUE(c.accept('n'));
  ASSERT_TRUE(c.accept('o'));
  EXPECT_TRUE(c.terminated());
  c.rollback(3);  // back before the marker: waiting again
  EXPECT_FALSE(c.active());
}

}  // namespace
}  // namespace m3::grammar
