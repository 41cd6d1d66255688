// Each subcommand of the m3serve binary registers itself on the CLI11 app from its own file.
#pragma once

namespace CLI {
class App;
}

namespace m3::app {

// Every register_* adds one subcommand whose callback runs it; the callback throws m3::Error on
// bad input, which main() prints and turns into exit status 1.
void register_version(CLI::App& app);

}  // namespace m3::app
