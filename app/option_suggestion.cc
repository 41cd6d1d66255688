#include "app/option_suggestion.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <vector>

namespace m3::app {

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

namespace {

std::vector<std::string> option_names(const CLI::App& cmd) {
  std::vector<std::string> names;
  const auto add_from = [&](const CLI::App& app) {
    for (const CLI::Option* opt : app.get_options()) {
      for (const std::string& l : opt->get_lnames()) names.push_back("--" + l);
      for (const std::string& s : opt->get_snames()) names.push_back("-" + s);
      for (const std::string& f : opt->get_fnames()) names.push_back("--" + f);  // negated flags
    }
  };
  add_from(cmd);
  for (const CLI::App* group : cmd.get_subcommands([](const CLI::App* sub) { return sub->get_name().empty(); })) {
    add_from(*group);  // option groups are nameless subcommands
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

}  // namespace

std::optional<std::string> closest_option(const CLI::App& cmd, std::string_view unknown) {
  if (const std::size_t eq = unknown.find('='); eq != std::string_view::npos) unknown = unknown.substr(0, eq);
  std::optional<std::string> best;
  std::size_t best_distance = 0;
  for (const std::string& name : option_names(cmd)) {
    const std::size_t d = edit_distance(unknown, name);
    if (!best || d < best_distance) {
      best = name;
      best_distance = d;
    }
  }
  const std::size_t limit = std::max<std::size_t>(2, unknown.size() / 3);
  if (!best || best_distance == 0 || best_distance > limit) return std::nullopt;
  return best;
}

std::string unknown_option_hints(const CLI::App& app) {
  const CLI::App* cmd = &app;
  std::string path = "m3serve";
  for (;;) {
    const auto selected = cmd->get_subcommands();
    const auto named = std::find_if(selected.begin(), selected.end(),
                                    [](const CLI::App* sub) { return !sub->get_name().empty(); });
    if (named == selected.end()) break;
    cmd = *named;
    path += " " + cmd->get_name();
  }
  std::string hints;
  for (const std::string& arg : app.remaining(/*recurse=*/true)) {
    if (arg.size() < 2 || arg[0] != '-') continue;
    if (auto name = closest_option(*cmd, arg)) {
      hints += "unknown option '" + arg + "' for '" + path + "'; did you mean '" + *name + "'?\n";
    }
  }
  return hints;
}

}  // namespace m3::app
