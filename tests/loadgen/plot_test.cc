// The Pareto frontier, the SVG, and the PNG's structure (signature, IHDR, chunk CRCs, the
// deflate stream inflated here, its Adler-32), checked independently of loadgen/png.
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

// A decoder of one final fixed-Huffman deflate block, enough for what encode_png writes.
std::string inflate_fixed(const std::string& z) {
  size_t bit = 0;
  auto read = [&](int n) {  // least significant bit first
    uint32_t v = 0;
    for (int i = 0; i < n; ++i, ++bit) v |= ((uint8_t(z.at(bit / 8)) >> (bit % 8)) & 1u) << i;
    return v;
  };
  auto read_code = [&](int n) {  // most significant bit first
    uint32_t v = 0;
    for (int i = 0; i < n; ++i) v = (v << 1) | read(1);
    return v;
  };
  EXPECT_EQ(read(1), 1u);  // final
  EXPECT_EQ(read(2), 1u);  // fixed codes
  static const int kBase[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
  static const int kExtra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
  std::string out;
  for (;;) {
    uint32_t v = read_code(7);
    int symbol;
    if (v <= 23) {
      symbol = 256 + int(v);
    } else {
      v = (v << 1) | read(1);
      if (v >= 0x30 && v <= 0xBF) {
        symbol = int(v - 0x30);
      } else if (v >= 0xC0 && v <= 0xC7) {
        symbol = 280 + int(v - 0xC0);
      } else {
        v = (v << 1) | read(1);
        symbol = 144 + int(v - 0x190);
      }
    }
    if (symbol < 256) {
      out.push_back(char(symbol));
      continue;
    }
    if (symbol == 256) break;
    const int length = kBase[symbol - 257] + int(read(kExtra[symbol - 257]));
    const uint32_t distance_code = read_code(5);
    EXPECT_EQ(distance_code, 0u);  // only distance 1 is written
    for (int i = 0; i < length; ++i) out.push_back(out.back());
  }
  return out;
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
  // Inflate it here (fixed Huffman codes, as written) and check the raw size and the Adler-32.
  const std::string raw = inflate_fixed(idat.substr(2, idat.size() - 6));
  EXPECT_EQ(raw.size(), 600u * (1 + 900 * 3));
  EXPECT_EQ(be32(idat, idat.size() - 4), adler32(reinterpret_cast<const uint8_t*>(raw.data()), raw.size()));
  EXPECT_LT(png.size(), 100000u);  // a plot is mostly runs
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
