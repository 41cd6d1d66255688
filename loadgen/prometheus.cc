#include "loadgen/prometheus.h"

#include <cstdlib>
#include <sstream>

namespace m3::loadgen {

std::map<std::string, double> parse_prometheus_text(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string::npos) continue;
    const std::string name = line.substr(0, name_end);
    size_t value_begin = name_end;
    if (line[name_end] == '{') {
      // Label values may hold spaces or braces inside quotes.
      bool quoted = false;
      for (size_t i = name_end + 1; i < line.size(); ++i) {
        if (line[i] == '\\' && quoted) {
          ++i;
        } else if (line[i] == '"') {
          quoted = !quoted;
        } else if (line[i] == '}' && !quoted) {
          value_begin = i + 1;
          break;
        }
      }
    }
    const char* start = line.c_str() + value_begin;
    char* end = nullptr;
    const double value = std::strtod(start, &end);
    if (end == start) continue;
    out[name] += value;
  }
  return out;
}

double metric_value(const std::map<std::string, double>& metrics, const std::string& name) {
  if (auto it = metrics.find(name + "_total"); it != metrics.end()) return it->second;
  if (auto it = metrics.find(name); it != metrics.end()) return it->second;
  return 0.0;
}

}  // namespace m3::loadgen
