// Loading a model's chat template and what the template sees, as transformers provides it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "text/chat_template.h"
#include "text/jinja/template.h"

namespace m3::text {
namespace {

class ModelDir {
 public:
  ModelDir() {
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() /
            ("m3_chat_template_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~ModelDir() { std::filesystem::remove_all(path_); }
  void write(const std::string& name, const std::string& text) const { std::ofstream(path_ / name) << text; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

ChatTemplateInput user_says(const std::string& text) {
  ChatTemplateInput input;
  input.messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", text}}});
  return input;
}

TEST(ChatTemplateLoad, TokenizerConfigTemplateSeesSpecialTokens) {
  ModelDir dir;
  dir.write("tokenizer_config.json", R"({
    "bos_token": "<s>",
    "eos_token": {"content": "</s>", "lstrip": false},
    "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
  })");
  ChatTemplate tmpl = ChatTemplate::load(dir.path());
  EXPECT_EQ(tmpl.render(user_says("hi")), "<s>[user]hi</s>[assistant]");
  ChatTemplateInput input = user_says("hi");
  input.add_generation_prompt = false;
  EXPECT_EQ(tmpl.render(input), "<s>[user]hi</s>");
}

TEST(ChatTemplateLoad, JinjaFileTakesPrecedence) {
  ModelDir dir;
  dir.write("tokenizer_config.json", R"({"bos_token": "B", "chat_template": "from config"})");
  dir.write("chat_template.jinja", "from file {{ bos_token }}\n");
  EXPECT_EQ(ChatTemplate::load(dir.path()).render(user_says("x")), "from file B");
}

TEST(ChatTemplateLoad, NamedTemplatesPickToolUseWhenToolsAreGiven) {
  ModelDir dir;
  dir.write("tokenizer_config.json", R"({"chat_template": [
    {"name": "default", "template": "plain"},
    {"name": "tool_use", "template": "tools: {{ tools|length }}"}]})");
  ChatTemplate tmpl = ChatTemplate::load(dir.path());
  ChatTemplateInput input = user_says("x");
  EXPECT_EQ(tmpl.render(input), "plain");
  input.tools = nlohmann::ordered_json::array({{{"type", "function"}}});
  EXPECT_EQ(tmpl.render(input), "tools: 1");
}

TEST(ChatTemplateLoad, MissingTemplateNamesTheDirectory) {
  ModelDir dir;
  dir.write("tokenizer_config.json", R"({"bos_token": "B"})");
  try {
    ChatTemplate::load(dir.path());
    FAIL() << "expected an error";
  } catch (const m3::Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir.path().string()), std::string::npos) << e.what();
  }
}

TEST(ChatTemplateLoad, SyntaxErrorNamesTheFileAndLine) {
  ModelDir dir;
  dir.write("chat_template.jinja", "ok\n{% for m in messages %}\n");
  try {
    ChatTemplate::load(dir.path());
    FAIL() << "expected an error";
  } catch (const jinja::TemplateError& e) {
    EXPECT_NE(std::string(e.what()).find("chat_template.jinja"), std::string::npos) << e.what();
    EXPECT_GT(e.line(), 0);
  }
}

TEST(ChatTemplateRender, KwargsOverrideSpecialTokensAndToolsDefaultToNone) {
  ChatTemplate tmpl("{{ bos_token }}|{{ tools }}|{{ documents }}|{{ thinking_mode }}", "t",
                    {{"bos_token", "B"}});
  ChatTemplateInput input = user_says("x");
  input.kwargs = {{"bos_token", "override"}, {"thinking_mode", "enabled"}};
  EXPECT_EQ(tmpl.render(input), "override|None|None|enabled");
}

TEST(ChatTemplateRender, KwargsMayNotReplaceMessages) {
  ChatTemplate tmpl("{{ messages }}", "t");
  ChatTemplateInput input = user_says("x");
  input.kwargs = {{"messages", "nope"}};
  EXPECT_THROW(tmpl.render(input), m3::Error);
}

TEST(ChatTemplateRender, ToolSchemaKeysKeepTheirOrder) {
  ChatTemplate tmpl("{% for t in tools %}{{ t | tojson }}{% endfor %}", "t");
  ChatTemplateInput input = user_says("x");
  input.tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": 2}}}])");
  EXPECT_EQ(tmpl.render(input), R"({"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": 2}}})");
}

TEST(ChatTemplateRender, StrftimeNowUsesTheGivenTime) {
  ChatTemplate tmpl("{{ strftime_now('%Y') }}", "t");
  ChatTemplateInput input = user_says("x");
  input.now = 0;  // 1970 in every time zone west of +24h... and east of it on Jan 1
  std::string year = tmpl.render(input);
  EXPECT_TRUE(year == "1970" || year == "1969") << year;
}

}  // namespace
}  // namespace m3::text
