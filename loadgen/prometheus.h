// The few counters the report reads from a server's /metrics (Prometheus text format).
#pragma once
#include <map>
#include <string>

namespace m3::loadgen {

// Sum of each metric's samples over all its label sets ("vllm:prefix_cache_hits_total" -> 1234).
std::map<std::string, double> parse_prometheus_text(const std::string& text);

// vLLM's counter names, with and without the _total suffix of older exporters.
double metric_value(const std::map<std::string, double>& metrics, const std::string& name);

}  // namespace m3::loadgen
