// The `vllm serve` options that have no counterpart in m3serve, in one table: each is accepted,
// so existing command lines run, and logs one line saying what m3serve does instead. Options
// with a meaning here are real options elsewhere (app/model_loader.h, app/cmd_serve.cc); an option
// that m3serve cannot honour is an error there, never a row here.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace CLI {
class App;
}

namespace m3::app {

struct CompatFlag {
  std::string_view name;     // "--attention-backend"
  bool takes_value;          // an option with a value, or a bare flag
  std::string_view instead;  // what m3serve does instead (the log line's text)
};

// The table (app/vllm_compat_flags.cc).
const std::vector<CompatFlag>& vllm_compat_flags();

// The flags of the table a command line gave, in the order given, with their values.
struct GivenCompatFlags {
  struct Given {
    const CompatFlag* flag;
    std::string value;  // empty for a bare flag
  };
  std::vector<Given> given;
};

// Adds every flag of the table to `cmd`, recording the given ones in `out` (which must outlive
// the parse).
void add_vllm_compat_flags(CLI::App& cmd, GivenCompatFlags& out);

// One info line per given flag: "--attention-backend FLASHINFER: <what m3serve does instead>".
void log_vllm_compat_flags(const GivenCompatFlags& given);

}  // namespace m3::app
