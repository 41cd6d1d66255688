// Chat templates: renders a model's Jinja chat template exactly as transformers'
// apply_chat_template does (ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks,
// loop controls, tojson without ASCII escaping, raise_exception, strftime_now), through the
// interpreter in text/jinja/.
//
// What the template sees, as in transformers: `messages`, `tools` (None when absent),
// `documents` (None when absent), `add_generation_prompt`, the tokenizer's special tokens
// (`bos_token`, `eos_token`, ... from tokenizer_config.json) and then every key of `kwargs`
// (chat_template_kwargs such as `thinking_mode` or `reasoning_effort`), which override the
// special tokens. JSON objects keep their key order (nlohmann::ordered_json), because
// `tojson` of a tool schema prints keys in the order the client sent them.
#pragma once
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace m3::jinja {
class Template;
}

namespace m3::text {

struct ChatTemplateInput {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;      // null -> None; else a list of JSON schemas, passed as is
  nlohmann::ordered_json documents;  // null -> None
  bool add_generation_prompt = true;
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();  // chat_template_kwargs
  // strftime_now() reads this instead of the clock when set (tests); local time, like Python.
  std::optional<std::time_t> now;
};

class ChatTemplate {
 public:
  // Reads DIR/chat_template.jinja when present, else "chat_template" of DIR/tokenizer_config.json
  // (a string, or a list of {name, template}: "default", and "tool_use" when tools are given),
  // plus the special tokens of tokenizer_config.json. Throws m3::Error naming the file.
  static ChatTemplate load(const std::filesystem::path& model_dir);

  // `origin` names the template in error messages (a file path). `special_tokens` is an object
  // of template variables such as {"bos_token": "]~!b["}. Throws jinja::TemplateError (an
  // m3::Error) with the line of a syntax error.
  ChatTemplate(const std::string& source, const std::string& origin,
               nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object());
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // The prompt text. Thread-safe (the parsed template is immutable). Throws
  // jinja::TemplateError: `raised_by_template()` tells a raise_exception() of the template
  // (the client's request does not fit the template: HTTP 400) from a template bug.
  std::string render(const ChatTemplateInput& input) const;

  // Adds a named alternative template (tokenizer_config's list form); "tool_use" is picked when
  // tools are given.
  void add_named(const std::string& name, const std::string& source);

  const std::string& source() const;

 private:
  struct Entry;
  std::unique_ptr<Entry> default_;
  std::map<std::string, std::unique_ptr<Entry>> named_;
  nlohmann::ordered_json special_tokens_;
  std::string origin_;
};

}  // namespace m3::text
