// "Did you mean": CLI11 refuses a misspelled option with a bare "not expected" error; this finds
// the closest option name of the command that was being parsed (Levenshtein distance over its
// long and short names, negated flags included) so main() can suggest it.
#pragma once
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace CLI {
class App;
}

namespace m3::app {

// Edits (insertions, deletions, substitutions) that turn `a` into `b`.
std::size_t edit_distance(std::string_view a, std::string_view b);

// The option of `cmd` closest to `unknown` ("--enable-chunk-prefill" or "--max-model-len=4"),
// when it is close enough to be a misspelling (at most a third of the name's length, at least
// 2 edits); nullopt otherwise.
std::optional<std::string> closest_option(const CLI::App& cmd, std::string_view unknown);

// After a parse refused arguments: "unknown option '--x' for 'm3serve serve'; did you mean
// '--y'?" lines for each refused argument that looks like an option, for the deepest
// subcommand that was selected. Empty when there is nothing to suggest.
std::string unknown_option_hints(const CLI::App& app);

}  // namespace m3::app
