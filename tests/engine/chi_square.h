// Two-sample chi-square for the engine's distribution tests: do two samples of tokens (plain
// decoding's and speculative decoding's, over many seeds) come from one distribution?
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace m3::test {

// One category per token (those seen fewer than 10 times pooled): the statistic of the two
// samples' difference and its degrees of freedom.
inline std::pair<double, int> two_sample_chi_square(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  std::map<int32_t, std::pair<int, int>> counts;
  for (int32_t t : a) ++counts[t].first;
  for (int32_t t : b) ++counts[t].second;
  std::vector<std::pair<int, int>> cells;
  std::pair<int, int> other{0, 0};
  for (const auto& [t, c] : counts) {
    if (c.first + c.second >= 10) cells.push_back(c);
    else other.first += c.first, other.second += c.second;
  }
  if (other.first + other.second > 0) cells.push_back(other);
  double stat = 0;
  for (const auto& [x, y] : cells) stat += double(x - y) * (x - y) / (x + y);
  return {stat, static_cast<int>(cells.size()) - 1};
}

// The chi-square value a statistic of `df` degrees of freedom exceeds with probability 1e-4
// (Wilson-Hilferty).
inline double chi_square_critical_1e4(int df) {
  const double z = 3.719, w = 2.0 / (9.0 * std::max(df, 1));
  return std::max(df, 1) * std::pow(1.0 - w + z * std::sqrt(w), 3.0);
}

}  // namespace m3::test
