#include "text/chat_template.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "text/jinja/template.h"

namespace m3::text {
namespace {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  M3_CHECK(in.good(), "cannot read {}", path.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The tokenizer's special_tokens_map, which transformers passes to every chat template.
nlohmann::ordered_json special_tokens_of(const nlohmann::ordered_json& config) {
  nlohmann::ordered_json tokens = nlohmann::ordered_json::object();
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                          "mask_token"}) {
    auto it = config.find(key);
    if (it == config.end()) continue;
    if (it->is_string()) {
      tokens[key] = *it;
    } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
      tokens[key] = (*it)["content"];  // an AddedToken written out in full
    }
  }
  auto extra = config.find("additional_special_tokens");
  if (extra != config.end() && extra->is_array()) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& token : *extra) {
      list.push_back(token.is_object() && token.contains("content") ? token["content"] : token);
    }
    tokens["additional_special_tokens"] = std::move(list);
  }
  return tokens;
}

}  // namespace

struct ChatTemplate::Entry {
  std::string source;
  jinja::Template compiled;
};

ChatTemplate::ChatTemplate(const std::string& source, const std::string& origin,
                           nlohmann::ordered_json special_tokens)
    : default_(std::make_unique<Entry>(Entry{source, jinja::Template::parse(source, origin)})),
      special_tokens_(std::move(special_tokens)),
      origin_(origin) {
  M3_CHECK(special_tokens_.is_object(), "{}: special tokens must be a JSON object", origin);
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

void ChatTemplate::add_named(const std::string& name, const std::string& source) {
  std::string origin = fmt::format("{} ({})", origin_, name);
  named_[name] = std::make_unique<Entry>(Entry{source, jinja::Template::parse(source, origin)});
}

const std::string& ChatTemplate::source() const { return default_->source; }

ChatTemplate ChatTemplate::load(const std::filesystem::path& model_dir) {
  std::filesystem::path config_path = model_dir / "tokenizer_config.json";
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  if (std::filesystem::exists(config_path)) {
    try {
      config = nlohmann::ordered_json::parse(read_file(config_path));
    } catch (const nlohmann::json::exception& e) {
      m3::fail("{}: invalid JSON: {}", config_path.string(), e.what());
    }
  }
  nlohmann::ordered_json special = special_tokens_of(config);
  // A chat_template.jinja file takes precedence over the copy in tokenizer_config.json.
  std::filesystem::path jinja_path = model_dir / "chat_template.jinja";
  if (std::filesystem::exists(jinja_path)) {
    return ChatTemplate(read_file(jinja_path), jinja_path.string(), std::move(special));
  }
  auto it = config.find("chat_template");
  M3_CHECK(it != config.end(), "{}: no chat template (neither chat_template.jinja nor a \"chat_template\" "
           "entry in tokenizer_config.json)", model_dir.string());
  std::string origin = config_path.string();
  if (it->is_string()) return ChatTemplate(it->get<std::string>(), origin, std::move(special));
  // The list form: [{"name": "default", "template": ...}, {"name": "tool_use", ...}].
  M3_CHECK(it->is_array(), "{}: \"chat_template\" must be a string or a list of named templates", origin);
  std::map<std::string, std::string> named;
  for (const auto& entry : *it) {
    M3_CHECK(entry.is_object() && entry.contains("name") && entry.contains("template") &&
                 entry["name"].is_string() && entry["template"].is_string(),
             "{}: each named chat template needs a \"name\" and a \"template\" string", origin);
    named[entry["name"].get<std::string>()] = entry["template"].get<std::string>();
  }
  M3_CHECK(named.count("default"), "{}: the named chat templates have no \"default\"", origin);
  ChatTemplate result(named["default"], origin + " (default)", std::move(special));
  for (const auto& [name, source] : named) {
    if (name != "default") result.add_named(name, source);
  }
  return result;
}

std::string ChatTemplate::render(const ChatTemplateInput& input) const {
  M3_CHECK(input.messages.is_array(), "chat template input: messages must be a list");
  const Entry* entry = default_.get();
  if (!input.tools.is_null()) {
    auto tool_use = named_.find("tool_use");
    if (tool_use != named_.end()) entry = tool_use->second.get();
  }
  // Passed by reference: the request's messages and tools are not copied.
  const nlohmann::ordered_json generation_prompt = input.add_generation_prompt;
  jinja::Template::VariableRefs variables = {{"messages", &input.messages},
                                             {"tools", &input.tools},
                                             {"documents", &input.documents},
                                             {"add_generation_prompt", &generation_prompt}};
  for (auto it = special_tokens_.begin(); it != special_tokens_.end(); ++it) {
    variables.emplace_back(it.key(), &it.value());
  }
  M3_CHECK(input.kwargs.is_object(), "chat_template_kwargs must be a JSON object");
  for (auto it = input.kwargs.begin(); it != input.kwargs.end(); ++it) {
    const std::string& key = it.key();
    // transformers passes these as keyword arguments too: Python refuses a second value.
    M3_CHECK(key != "messages" && key != "tools" && key != "documents" && key != "add_generation_prompt",
             "chat_template_kwargs may not set '{}'", key);
    variables.emplace_back(key, &it.value());
  }
  jinja::RenderOptions options;
  options.now = input.now;
  return entry->compiled.render(variables, options);
}

}  // namespace m3::text
