// m3serve tokenize --model DIR (--text STR | --file F) [--json] [--no-special-tokens]
// Prints the token ids of a text (space separated), or with --json an object with the ids and
// the token strings, as the model's tokenizer.json encodes it.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "app/commands.h"
#include "core/error.h"
#include "app/model_source.h"
#include "text/tokenizer.h"

namespace m3::app {

namespace {

struct TokenizeOptions {
  std::string model_dir;
  HubOptions hub;  // when model_dir is a Hugging Face repo id
  std::string text;
  std::string file;
  bool json = false;
  bool no_special_tokens = false;
};

std::string read_input_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  M3_CHECK(in.good(), "tokenize: cannot open --file {}", path);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

void run_tokenize(const TokenizeOptions& options, bool have_text, bool have_file) {
  M3_CHECK(have_text != have_file, "tokenize: give exactly one of --text and --file");
  const auto tokenizer =
      text::Tokenizer::load(locate_model_dir(options.model_dir, options.hub, hub::FileSet::kTokenizer, "--model"));
  const std::string input = have_text ? options.text : read_input_file(options.file);
  const std::vector<int32_t> ids = tokenizer.encode(input, !options.no_special_tokens);
  if (!options.json) {
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) line.push_back(' ');
      line.append(std::to_string(ids[i]));
    }
    std::printf("%s\n", line.c_str());
    return;
  }
  nlohmann::json out;
  out["ids"] = ids;
  auto& tokens = out["tokens"] = nlohmann::json::array();
  for (const int32_t id : ids) tokens.push_back(tokenizer.id_to_token(id).value_or(""));
  out["count"] = ids.size();
  std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto options = std::make_shared<TokenizeOptions>();
  auto* cmd = app.add_subcommand("tokenize", "print the token ids of a text");
  cmd->add_option("--model", options->model_dir,
                  "model directory holding tokenizer.json, or a Hugging Face repo id (org/name)")
      ->required();
  add_hub_options(*cmd, options->hub);
  auto* text = cmd->add_option("--text", options->text, "text to encode");
  auto* file = cmd->add_option("--file", options->file, "file whose contents to encode");
  cmd->add_flag("--json", options->json, "print {\"ids\", \"tokens\", \"count\"} as JSON");
  cmd->add_flag("--no-special-tokens", options->no_special_tokens,
                "do not add the post-processor's special tokens (BOS/EOS templates)");
  cmd->callback([options, text, file] {
    run_tokenize(*options, text->count() > 0, file->count() > 0);
  });
}

}  // namespace m3::app
