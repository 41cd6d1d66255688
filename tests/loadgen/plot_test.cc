// The Pareto frontier, the SVG, and the PNG's structure (signature, IHDR, chunk CRCs, the stored
// deflate stream's Adler-32), with checksums computed here independently of loadgen/png.
#include <gtest/gtest.h>

#include <cstdint>

#include "loadgen/plot.h"
#include "loadgen/png.h"

namespace m3::loadgen {
namespace {

uint32_t be32(const std::string& s, size_t at) {
  return (uint32_t(uint8_t(s[at])) << 24) | (uint32_t(uint8_t(s[at + 1])) << 16) |
         (uint32_t(uint8_t(s[at + 2])) << 8) | uint32_t(uint8_t(s[at + 3]));
}

uint32_t slow_crc(const std::string& s) {  // bit by bit, no table
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

TEST(Plot, ParetoFrontierKeepsTheUndominated) {
  const std::vector<PlotPoint> pts = {{1, 10, 8}, {2, 8, 4}, {1.5, 7, 6}, {3, 3, 1}, {3, 2, 2}};
  EXPECT_EQ(pareto_frontier(pts), (std::vector<size_t>{0, 1, 3}));
  EXPECT_TRUE(pareto_frontier({}).empty());
}

TEST(Plot, SvgHasEverySeries) {
  const std::vector<PlotSeries> series = {{"fp8 KV", {{1, 10, 1}, {2, 5, 2}}}, {"nvfp4 <KV>", {{1.5, 12, 1}}}};
  const std::string svg = render_svg(series, "sweep");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("fp8 KV"), std::string::npos);
  EXPECT_NE(svg.find("nvfp4 &lt;KV&gt;"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

TEST(Plot, PngIsWellFormed) {
  const std::string png = render_png({{"a", {{1, 10, 1}, {2, 5, 2}}}}, "t");
  ASSERT_GT(png.size(), 33u);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  size_t at = 8;
  std::vector<std::string> types;
  std::string idat;
  while (at + 12 <= png.size()) {
    const uint32_t length = be32(png, at);
    const std::string typed = png.substr(at + 4, 4 + length);
    EXPECT_EQ(be32(png, at + 8 + length), slow_crc(typed)) << typed.substr(0, 4);
    types.push_back(typed.substr(0, 4));
    if (types.back() == "IHDR") {
      EXPECT_EQ(be32(typed, 4), 900u);
      EXPECT_EQ(be32(typed, 8), 600u);
    }
    if (types.back() == "IDAT") idat += typed.substr(4);
    at += 12 + length;
  }
  EXPECT_EQ(at, png.size());
  EXPECT_EQ(types, (std::vector<std::string>{"IHDR", "IDAT", "IEND"}));
  // Stored blocks: unwrap them and check the raw size and the Adler-32.
  std::string raw;
  size_t p = 2;
  for (bool last = false; !last;) {
    last = idat[p] & 1;
    const size_t n = uint8_t(idat[p + 1]) | (size_t(uint8_t(idat[p + 2])) << 8);
    raw += idat.substr(p + 5, n);
    p += 5 + n;
  }
  EXPECT_EQ(raw.size(), 600u * (1 + 900 * 3));
  EXPECT_EQ(be32(idat, p), adler32(reinterpret_cast<const uint8_t*>(raw.data()), raw.size()));
}

TEST(Plot, CanvasDrawsText) {
  Canvas c(40, 10, {255, 255, 255});
  c.text(0, 0, "A1", {0, 0, 0});
  int dark = 0;
  for (int y = 0; y < 10; ++y)
    for (int x = 0; x < 40; ++x) dark += c.at(x, y).r == 0;
  EXPECT_GT(dark, 10);
}

}  // namespace
}  // namespace m3::loadgen
