#include "text/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "text/tokenizer/added_vocabulary.h"
#include "text/tokenizer/bpe.h"
#include "text/tokenizer/decoders.h"
#include "text/tokenizer/json_fields.h"
#include "text/tokenizer/normalizers.h"
#include "text/tokenizer/post_processors.h"
#include "text/tokenizer/pre_tokenizers.h"
#include "text/tokenizer/unicode.h"

namespace m3::text {

using json_fields::Json;

struct Tokenizer::Impl {
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  BpeModel model;
  AddedVocabulary added;
  PostProcessor post_processor;
  Decoder decoder;
  Json config = Json::object();
  SpecialTokens special_tokens;
  std::optional<int64_t> model_max_length;
  int32_t vocab_size = 0;

  // The token string of an id: added tokens first, then the model vocab (the reference order).
  const std::string* content_of(int32_t id) const {
    if (const AddedToken* token = added.find_id(id)) return &token->text;
    return model.id_to_token(id);
  }
};

namespace {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  M3_CHECK(in.good(), "cannot open {}", path.string());
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

Json parse_json(std::string_view text, std::string_view source) {
  try {
    return Json::parse(text);
  } catch (const Json::parse_error& e) {
    m3::fail("{}: not valid JSON: {}", source, e.what());
  }
}

// A special token in tokenizer_config.json: a string, an AddedToken object or null.
std::optional<std::string> config_token(const Json& config, const char* field,
                                        std::string_view source) {
  const auto it = config.find(field);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  M3_CHECK(it->is_object() && it->contains("content") && (*it)["content"].is_string(),
           "{}: field '{}' must be a string, an object with 'content', or null", source, field);
  return (*it)["content"].get<std::string>();
}

void read_config(Tokenizer::SpecialTokens& special, std::optional<int64_t>& max_length,
                 const Json& config, std::string_view source) {
  M3_CHECK(config.is_object(), "{}: must be a JSON object", source);
  special.bos = config_token(config, "bos_token", source);
  special.eos = config_token(config, "eos_token", source);
  special.pad = config_token(config, "pad_token", source);
  special.unk = config_token(config, "unk_token", source);
  const auto it = config.find("model_max_length");
  if (it != config.end() && it->is_number()) {
    // transformers writes 1e30 for "no limit".
    const double value = it->get<double>();
    if (value > 0 && value < 1e18) max_length = static_cast<int64_t>(value);
  }
}

}  // namespace

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Tokenizer Tokenizer::load(const std::filesystem::path& model_dir) {
  const auto tokenizer_path = model_dir / "tokenizer.json";
  const auto config_path = model_dir / "tokenizer_config.json";
  M3_CHECK(std::filesystem::exists(tokenizer_path), "{} not found (m3serve needs a Hugging Face "
           "tokenizer.json beside the model)", tokenizer_path.string());
  const std::string config =
      std::filesystem::exists(config_path) ? read_file(config_path) : std::string();
  return from_json_text(read_file(tokenizer_path), config, tokenizer_path.string());
}

Tokenizer Tokenizer::from_json_text(std::string_view tokenizer_json,
                                    std::string_view tokenizer_config_json,
                                    std::string_view source) {
  auto impl = std::make_shared<Impl>();
  const std::string where(source);
  const Json spec = parse_json(tokenizer_json, where);
  M3_CHECK(spec.is_object(), "{}: must be a JSON object", where);
  if (const auto version = json_fields::get_optional_string(spec, "version", where)) {
    M3_CHECK(*version == "1.0", "{}: unsupported tokenizer.json version '{}' (expected 1.0)",
             where, *version);
  }
  for (const char* ignored : {"truncation", "padding"}) {
    if (spec.contains(ignored) && !spec[ignored].is_null()) {
      M3_LOG_WARN("{}: '{}' is ignored (m3serve never truncates or pads prompts)", where,
                  ignored);
    }
  }

  const Json& model = json_fields::require(spec, "model", where);
  const std::string model_where = where + ": model";
  const std::string model_type = model.contains("type")
                                     ? json_fields::type_of(model, model_where)
                                     : (model.contains("merges") ? "BPE" : "unknown");
  M3_CHECK(model_type == "BPE", "{}: unsupported model type '{}' (m3serve supports BPE only)",
           model_where, model_type);
  impl->model = BpeModel::from_json(model, model_where);

  auto component = [&](const char* name) -> const Json& {
    static const Json null_json;
    const auto it = spec.find(name);
    return it == spec.end() ? null_json : *it;
  };
  impl->normalizer = make_normalizer(component("normalizer"), where + ": normalizer");
  impl->pre_tokenizer =
      make_pre_tokenizer(component("pre_tokenizer"), where + ": pre_tokenizer");
  impl->post_processor =
      PostProcessor::from_json(component("post_processor"), where + ": post_processor");
  impl->decoder = Decoder::from_json(component("decoder"), where + ": decoder");
  impl->added = AddedVocabulary::from_json(component("added_tokens"), impl->model,
                                           impl->normalizer.get(), where + ": added_tokens");

  int64_t max_id = static_cast<int64_t>(impl->model.id_limit()) - 1;
  for (const auto& token : impl->added.tokens()) max_id = std::max<int64_t>(max_id, token.id);
  impl->vocab_size = static_cast<int32_t>(max_id + 1);

  if (!tokenizer_config_json.empty()) {
    const std::string config_source = where + " (tokenizer_config.json)";
    impl->config = parse_json(tokenizer_config_json, config_source);
    read_config(impl->special_tokens, impl->model_max_length, impl->config, config_source);
    const Tokenizer view(impl);
    for (const auto& name : {impl->special_tokens.bos, impl->special_tokens.eos,
                             impl->special_tokens.pad, impl->special_tokens.unk}) {
      if (name && !view.token_to_id(*name)) {
        M3_LOG_WARN("{}: special token {:?} is not in the vocabulary", config_source, *name);
      }
    }
  }
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& impl = *impl_;
  std::string repaired;
  if (!unicode::is_valid_utf8(text)) {
    repaired = unicode::to_valid_utf8(text);
    text = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  M3_CHECK(text.size() < (size_t{1} << 32), "encode: a {}-byte text is over the 4 GiB limit",
           text.size());
  BpeScratch scratch;
  Pieces pieces;
  Pieces pieces_scratch;
  std::vector<TextSegment> raw_segments;
  std::vector<TextSegment> normalized_segments;

  // 1. Added tokens that match the raw text; 2. normalize the rest and match the normalized
  // added tokens; 3. pre-tokenize and run BPE on what remains (Tokenizer::encode of the reference).
  impl.added.split(text, false, raw_segments);
  for (const auto& raw : raw_segments) {
    if (raw.token_id >= 0) {
      ids.push_back(raw.token_id);
      continue;
    }
    if (raw.end <= raw.begin) continue;
    std::string_view part = text.substr(raw.begin, raw.end - raw.begin);
    std::string normalized;
    if (impl.normalizer) {
      normalized = impl.normalizer->normalize(part);
      part = normalized;
    }
    normalized_segments.clear();
    impl.added.split(part, true, normalized_segments);
    for (const auto& segment : normalized_segments) {
      if (segment.token_id >= 0) {
        ids.push_back(segment.token_id);
        continue;
      }
      if (segment.end <= segment.begin) continue;
      pieces.clear();
      pieces.add(part.substr(segment.begin, segment.end - segment.begin));
      if (impl.pre_tokenizer) impl.pre_tokenizer->pre_tokenize(pieces, pieces_scratch);
      for (size_t i = 0; i < pieces.size(); ++i) impl.model.tokenize(pieces[i], scratch, ids);
    }
  }
  if (add_special_tokens) ids = impl.post_processor.apply(std::move(ids));
  return ids;
}

std::optional<std::string> Tokenizer::token_bytes(int32_t id) const {
  if (const AddedToken* token = impl_->added.find_id(id)) return token->text;
  const std::string* content = impl_->model.id_to_token(id);
  if (content == nullptr) return std::nullopt;
  return impl_->decoder.token_bytes(*content);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  return decode_continuation(ids, skip_special_tokens, false);
}

std::string Tokenizer::decode_continuation(std::span<const int32_t> ids, bool skip_special_tokens,
                                           bool continuation) const {
  const Impl& impl = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids) {
    const std::string* content = impl.content_of(id);
    if (content == nullptr) continue;
    if (skip_special_tokens && impl.added.is_special_content(*content)) continue;
    tokens.push_back(*content);
  }
  return impl.decoder.decode(std::move(tokens), continuation);
}

bool Tokenizer::decode_drops(int32_t id, bool skip_special_tokens) const {
  const std::string* content = impl_->content_of(id);
  return content == nullptr || (skip_special_tokens && impl_->added.is_special_content(*content));
}

bool Tokenizer::decoder_may_join_next(int32_t id) const {
  const std::string* content = impl_->content_of(id);
  return content != nullptr && impl_->decoder.is_byte_fallback_token(*content);
}

const std::string& Tokenizer::streaming_obstacle() const {
  return impl_->decoder.streaming_obstacle();
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (const auto id = impl_->added.token_to_id(token)) return id;
  return impl_->model.token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  const std::string* content = impl_->content_of(id);
  if (content == nullptr) return std::nullopt;
  return *content;
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

bool Tokenizer::is_special(int32_t id) const {
  const std::string* content = impl_->content_of(id);
  return content != nullptr && impl_->added.is_special_content(*content);
}

const Tokenizer::SpecialTokens& Tokenizer::special_tokens() const {
  return impl_->special_tokens;
}

std::optional<int32_t> Tokenizer::bos_token_id() const {
  return impl_->special_tokens.bos ? token_to_id(*impl_->special_tokens.bos) : std::nullopt;
}

std::optional<int32_t> Tokenizer::eos_token_id() const {
  return impl_->special_tokens.eos ? token_to_id(*impl_->special_tokens.eos) : std::nullopt;
}

std::optional<int32_t> Tokenizer::pad_token_id() const {
  return impl_->special_tokens.pad ? token_to_id(*impl_->special_tokens.pad) : std::nullopt;
}

std::optional<int64_t> Tokenizer::model_max_length() const { return impl_->model_max_length; }

const nlohmann::json& Tokenizer::tokenizer_config() const { return impl_->config; }

}  // namespace m3::text
