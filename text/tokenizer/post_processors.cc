#include "text/tokenizer/post_processors.h"

#include "core/error.h"
#include "text/tokenizer/json_fields.h"

namespace m3::text {

namespace {

using json_fields::Json;
using Piece = PostProcessor::Piece;

std::vector<Piece> parse_template(const Json& spec, const std::string& where) {
  const Json& single = json_fields::require(spec, "single", where);
  M3_CHECK(single.is_array(), "{}: field 'single' must be an array", where);
  const Json& special_tokens = json_fields::require(spec, "special_tokens", where);
  M3_CHECK(special_tokens.is_object(), "{}: field 'special_tokens' must be an object", where);
  std::vector<Piece> pieces;
  for (size_t i = 0; i < single.size(); ++i) {
    const std::string piece_where = fmt::format("{}.single[{}]", where, i);
    const Json& item = single[i];
    M3_CHECK(item.is_object() && item.size() == 1,
             "{}: must be {{\"Sequence\": ...}} or {{\"SpecialToken\": ...}}", piece_where);
    if (item.contains("Sequence")) {
      pieces.push_back({true, {}});
      continue;
    }
    M3_CHECK(item.contains("SpecialToken"),
             "{}: must be {{\"Sequence\": ...}} or {{\"SpecialToken\": ...}}", piece_where);
    const std::string name = json_fields::get_string(item["SpecialToken"], "id", piece_where);
    M3_CHECK(special_tokens.contains(name), "{}: special token {:?} is not in 'special_tokens'",
             piece_where, name);
    const Json& ids = json_fields::require(special_tokens[name], "ids",
                                           fmt::format("{}.special_tokens[{:?}]", where, name));
    M3_CHECK(ids.is_array(), "{}: special_tokens[{:?}].ids must be an array", where, name);
    Piece piece;
    for (const auto& id : ids) {
      M3_CHECK(id.is_number_integer(), "{}: special_tokens[{:?}].ids must hold integers", where,
               name);
      piece.ids.push_back(id.get<int32_t>());
    }
    pieces.push_back(std::move(piece));
  }
  return pieces;
}

// BertProcessing / RobertaProcessing: [cls] sequence [sep], each given as ["token", id].
std::vector<Piece> parse_cls_sep(const Json& spec, const std::string& where) {
  auto id_of = [&](const char* field) {
    const Json& pair = json_fields::require(spec, field, where);
    M3_CHECK(pair.is_array() && pair.size() == 2 && pair[1].is_number_integer(),
             "{}: field '{}' must be [\"token\", id]", where, field);
    return pair[1].get<int32_t>();
  };
  return {Piece{false, {id_of("cls")}}, Piece{true, {}}, Piece{false, {id_of("sep")}}};
}

void collect_stages(const Json& spec, const std::string& where,
                    std::vector<std::vector<Piece>>& stages) {
  if (spec.is_null()) return;
  const std::string type = json_fields::type_of(spec, where);
  if (type == "ByteLevel") return;  // it only adjusts offsets
  if (type == "TemplateProcessing") {
    stages.push_back(parse_template(spec, where));
    return;
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    stages.push_back(parse_cls_sep(spec, where));
    return;
  }
  if (type == "Sequence") {
    const Json& list = json_fields::require(spec, "processors", where);
    M3_CHECK(list.is_array(), "{}: field 'processors' must be an array", where);
    for (size_t i = 0; i < list.size(); ++i) {
      collect_stages(list[i], fmt::format("{}.processors[{}]", where, i), stages);
    }
    return;
  }
  m3::fail("{}: unsupported post_processor type '{}' (supported: TemplateProcessing, "
           "BertProcessing, RobertaProcessing, ByteLevel, Sequence)",
           where, type);
}

}  // namespace

PostProcessor PostProcessor::from_json(const Json& spec, const std::string& where) {
  PostProcessor processor;
  collect_stages(spec, where, processor.stages_);
  return processor;
}

std::vector<int32_t> PostProcessor::apply(std::vector<int32_t> ids) const {
  for (const auto& stage : stages_) {
    std::vector<int32_t> out;
    out.reserve(ids.size() + 4);
    for (const auto& piece : stage) {
      if (piece.is_sequence) {
        out.insert(out.end(), ids.begin(), ids.end());
      } else {
        out.insert(out.end(), piece.ids.begin(), piece.ids.end());
      }
    }
    ids = std::move(out);
  }
  return ids;
}

}  // namespace m3::text
