#include "server/constraint_compiler.h"

#include <fmt/format.h>

#include "grammar/grammar_constraint.h"
#include "grammar/grammar_error.h"
#include "grammar/tool_call_grammar.h"
#include "server/api_error.h"
#include "text/tool_calls/markup.h"

namespace m3::server {

const ConstraintCompiler::Vocab& ConstraintCompiler::vocab(const Target& target) {
  std::unique_ptr<Vocab>& slot = vocabs_[target.special_tokens_visible ? 1 : 0];
  if (slot) return *slot;
  const text::Tokenizer& tok = *target.tokenizer;
  std::vector<std::optional<std::string>> bytes(static_cast<size_t>(target.vocab_size));
  auto texts = std::make_shared<std::vector<std::string>>(static_cast<size_t>(target.vocab_size));
  bool any = false;
  for (int32_t id = 0; id < target.vocab_size && id < tok.vocab_size(); ++id) {
    std::optional<std::string> b = tok.token_bytes(id);
    if (!b) continue;
    (*texts)[static_cast<size_t>(id)] = *b;
    if (tok.is_special(id) && !target.special_tokens_visible) continue;
    bytes[static_cast<size_t>(id)] = std::move(b);
    any = true;
  }
  if (!any) {
    throw ApiError(400, "structured outputs need a byte-level BPE tokenizer; this model's tokenizer has another decoder");
  }
  auto v = std::make_unique<Vocab>();
  v->vocabulary = std::make_shared<const grammar::Vocabulary>(bytes, target.eos_token_ids);
  v->texts = std::move(texts);
  slot = std::move(v);
  return *slot;
}

std::shared_ptr<grammar::CompiledGrammar> ConstraintCompiler::compiled(const std::string& key,
                                                                       const std::function<grammar::Grammar()>& build,
                                                                       const Target& target, const std::string& field) {
  const std::string full_key = fmt::format("{}|{}", target.special_tokens_visible ? 1 : 0, key);
  if (auto it = cache_.find(full_key); it != cache_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second->second;
  }
  std::shared_ptr<grammar::CompiledGrammar> g;
  try {
    g = std::make_shared<grammar::CompiledGrammar>(build(), vocab(target).vocabulary, field);
  } catch (const grammar::GrammarError& e) {
    throw ApiError(400, e.what(), e.keyword());
  }
  lru_.emplace_front(full_key, g);
  cache_[full_key] = lru_.begin();
  if (lru_.size() > kMaxCachedGrammars) {
    cache_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return g;
}

std::shared_ptr<const TokenConstraintSpec> ConstraintCompiler::for_spec(const grammar::StructuredOutputSpec& spec,
                                                                        const Target& target) {
  std::unique_lock lock(mu_);
  std::string key = fmt::format("spec|{}|{}", static_cast<int>(spec.kind), spec.field);
  switch (spec.kind) {
    case grammar::StructuredOutputSpec::Kind::kJsonSchema: key += spec.schema.dump(); break;
    case grammar::StructuredOutputSpec::Kind::kChoice: key += nlohmann::json(spec.choices).dump(); break;
    default: key += spec.text;
  }
  auto g = compiled(key, [&] { return grammar::structured_output_grammar(spec); }, target, spec.field);
  auto out = std::make_shared<grammar::GrammarConstraintSpec>(g, vocab(target).texts, target.start_after);
  lock.unlock();  // other requests compile meanwhile
  g->wait_precomputed_for(kFirstUseWait);
  return out;
}

std::shared_ptr<const TokenConstraintSpec> ConstraintCompiler::for_tool_calls(std::string_view parser,
                                                                              const nlohmann::ordered_json& tools,
                                                                              const std::string& only, bool parallel,
                                                                              const Target& target) {
  std::unique_lock lock(mu_);
  M3_CHECK(parser == "minimax_m3" || parser == "minimax_m2", "no tool-call grammar for the parser '{}'", parser);
  const std::string key = fmt::format("tools|{}|{}|{}|{}", parser, only, parallel ? 1 : 0, tools.dump());
  grammar::ToolCallGrammarOptions o;
  o.markup = parser == "minimax_m2" ? grammar::ToolCallMarkup::kMiniMaxM2 : grammar::ToolCallMarkup::kMiniMaxM3;
  o.namespace_marker = std::string(text::tool_calls::kM3Namespace);
  o.parallel = parallel;
  auto g = compiled(key, [&] { return grammar::tool_call_grammar(tools, only, o); }, target, "tools");
  auto out = std::make_shared<grammar::GrammarConstraintSpec>(g, vocab(target).texts, target.start_after);
  lock.unlock();
  g->wait_precomputed_for(kFirstUseWait);
  return out;
}

}  // namespace m3::server
