#include "tests/text_jinja/corpus.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace m3::test {
namespace {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

std::string escape_for_display(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\t') {
      out += "\\t";
    } else {
      out.push_back(ch);
    }
  }
  return out;
}

}  // namespace

std::vector<Case> load_snippet_cases(const std::string& dir) {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".txt") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  std::vector<Case> cases;
  for (const auto& path : files) {
    std::istringstream in(read_file(path));
    std::string line;
    Case* current = nullptr;
    while (std::getline(in, line)) {
      if (starts_with(line, "### case ")) {
        cases.push_back(Case{});
        current = &cases.back();
        std::string name = line.substr(9);
        if (!name.empty() && name.back() == '\r') name.pop_back();
        current->name = path.stem().string() + "/" + name;
        current->variables = nlohmann::ordered_json::object();
        continue;
      }
      if (current == nullptr) continue;  // file comment before the first case
      if (starts_with(line, "### vars ")) {
        current->variables = nlohmann::ordered_json::parse(line.substr(9));
        continue;
      }
      if (starts_with(line, "### error")) {
        current->expect_error = true;
        continue;
      }
      current->source += line;
      current->source += '\n';
    }
  }
  return cases;
}

std::vector<Case> load_chat_cases(const std::string& manifest_path) {
  auto manifest = nlohmann::ordered_json::parse(read_file(manifest_path));
  std::vector<Case> cases;
  for (const auto& tmpl : manifest["templates"]) {
    std::string file = tmpl["file"];
    std::string source = read_file(file);
    for (const auto& conversation_file : manifest["conversations"]) {
      auto conversation = nlohmann::ordered_json::parse(read_file(conversation_file.get<std::string>()));
      size_t variant = 0;
      for (const auto& kwargs : tmpl["kwargs"]) {
        for (bool generation_prompt : {true, false}) {
          Case c;
          c.is_chat = true;
          c.name = fmt::format("{} x {} kwargs#{}{}", std::filesystem::path(file).filename().string(),
                               std::filesystem::path(conversation_file.get<std::string>()).stem().string(),
                               variant, generation_prompt ? " +gen" : "");
          c.source = source;
          c.special_tokens = tmpl.value("special_tokens", nlohmann::ordered_json::object());
          c.input.messages = conversation["messages"];
          c.input.tools = conversation.value("tools", nlohmann::ordered_json());
          c.input.documents = conversation.value("documents", nlohmann::ordered_json());
          c.input.add_generation_prompt = generation_prompt;
          c.input.kwargs = kwargs;
          c.input.now = manifest["now"].get<std::time_t>();
          cases.push_back(std::move(c));
        }
        ++variant;
      }
    }
  }
  return cases;
}

std::vector<ReferenceResult> run_reference(const std::vector<Case>& cases) {
  nlohmann::ordered_json batch = nlohmann::ordered_json::array();
  for (const Case& c : cases) {
    nlohmann::ordered_json item;
    item["template"] = c.source;
    if (c.is_chat) {
      item["messages"] = c.input.messages;
      item["tools"] = c.input.tools;
      item["documents"] = c.input.documents;
      item["add_generation_prompt"] = c.input.add_generation_prompt;
      item["special_tokens"] = c.special_tokens;
      item["kwargs"] = c.input.kwargs;
      item["now"] = *c.input.now;
    } else {
      item["variables"] = c.variables;
    }
    batch.push_back(std::move(item));
  }
  auto dir = std::filesystem::temp_directory_path() / fmt::format("m3_jinja_reference_{}", getpid());
  std::filesystem::create_directories(dir);
  std::string in_path = (dir / "cases.json").string(), out_path = (dir / "results.json").string();
  std::ofstream(in_path) << batch.dump();
  std::string command = fmt::format("{} tools/render_chat_reference.py --batch {} --out {}", M3_REFERENCE_PYTHON,
                                    in_path, out_path);
  int status = std::system(command.c_str());
  if (status != 0) throw std::runtime_error("the reference renderer failed: " + command);
  auto results_json = nlohmann::json::parse(read_file(out_path));
  std::filesystem::remove_all(dir);
  std::vector<ReferenceResult> results;
  for (const auto& r : results_json) {
    ReferenceResult result;
    result.ok = r["ok"];
    if (result.ok) {
      result.text = r["text"];
    } else {
      result.type = r["type"];
      result.message = r["message"];
    }
    results.push_back(std::move(result));
  }
  if (results.size() != cases.size()) throw std::runtime_error("the reference renderer lost cases");
  return results;
}

std::string describe_difference(const std::string& expected, const std::string& actual) {
  size_t at = 0;
  while (at < expected.size() && at < actual.size() && expected[at] == actual[at]) ++at;
  size_t from = at > 60 ? at - 60 : 0;
  return fmt::format("outputs differ at byte {} (expected {} bytes, got {})\n  expected: ...{}\n  actual:   ...{}",
                     at, expected.size(), actual.size(), escape_for_display(expected.substr(from, 140)),
                     escape_for_display(actual.substr(from, 140)));
}

}  // namespace m3::test
