// m3serve render-chat --model DIR --messages FILE.json [--tools FILE.json] [--kwargs JSON]
//                     [--no-generation-prompt]
// Prints the exact prompt text the model's chat template produces, as transformers'
// apply_chat_template(tokenize=False) would. FILE.json holds a list of messages or an OpenAI
// request body ({"messages": [...], "tools": [...]}); --tools (a list, or a body with "tools")
// overrides the body's tools.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "app/commands.h"
#include "app/model_source.h"
#include "core/error.h"
#include "text/chat_template.h"

namespace m3::app {
namespace {

struct RenderChatOptions {
  std::string model_dir;
  HubOptions hub;  // when model_dir is a Hugging Face repo id
  std::string messages_file;
  std::string tools_file;
  std::string kwargs = "{}";
  bool no_generation_prompt = false;
};

nlohmann::ordered_json read_json_file(const std::string& path, const char* option) {
  std::ifstream in(path, std::ios::binary);
  M3_CHECK(in.good(), "render-chat: cannot open {} {}", option, path);
  std::ostringstream text;
  text << in.rdbuf();
  try {
    return nlohmann::ordered_json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    m3::fail("render-chat: {} {} is not valid JSON: {}", option, path, e.what());
  }
}

void run_render_chat(const RenderChatOptions& options) {
  text::ChatTemplateInput input;
  nlohmann::ordered_json messages = read_json_file(options.messages_file, "--messages");
  if (messages.is_object()) {
    M3_CHECK(messages.contains("messages"), "render-chat: {} has no \"messages\"", options.messages_file);
    if (messages.contains("tools")) input.tools = messages["tools"];
    input.messages = messages["messages"];
  } else {
    input.messages = std::move(messages);
  }
  M3_CHECK(input.messages.is_array(), "render-chat: the messages in {} must be a list", options.messages_file);
  if (!options.tools_file.empty()) {
    nlohmann::ordered_json tools = read_json_file(options.tools_file, "--tools");
    if (tools.is_object() && tools.contains("tools")) tools = tools["tools"];
    M3_CHECK(tools.is_array(), "render-chat: {} must hold a list of tools (or {{\"tools\": [...]}})",
             options.tools_file);
    input.tools = std::move(tools);
  }
  try {
    input.kwargs = nlohmann::ordered_json::parse(options.kwargs);
  } catch (const nlohmann::json::exception& e) {
    m3::fail("render-chat: --kwargs is not valid JSON: {}", e.what());
  }
  M3_CHECK(input.kwargs.is_object(), "render-chat: --kwargs must be a JSON object");
  input.add_generation_prompt = !options.no_generation_prompt;
  const std::string model_dir = locate_model_dir(options.model_dir, options.hub, hub::FileSet::kTokenizer, "--model");
  const std::string prompt = text::ChatTemplate::load(model_dir).render(input);
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
}

}  // namespace

void register_render_chat(CLI::App& app) {
  auto options = std::make_shared<RenderChatOptions>();
  auto* cmd = app.add_subcommand("render-chat", "print the prompt a model's chat template makes of a conversation");
  cmd->add_option("--model", options->model_dir,
                  "model directory (chat_template.jinja or tokenizer_config.json), or a Hugging Face repo id")
      ->required();
  add_hub_options(*cmd, options->hub);
  cmd->add_option("--messages", options->messages_file, "JSON file: a list of messages or {\"messages\": [...]}")
      ->required();
  cmd->add_option("--tools", options->tools_file, "JSON file: a list of tool schemas or {\"tools\": [...]}");
  cmd->add_option("--kwargs", options->kwargs, "chat_template_kwargs as a JSON object, e.g. '{\"thinking_mode\": \"enabled\"}'");
  cmd->add_flag("--no-generation-prompt", options->no_generation_prompt, "leave out the assistant turn opener");
  cmd->callback([options] { run_render_chat(*options); });
}

}  // namespace m3::app
