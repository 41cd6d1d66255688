#include "loadgen/png.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>

namespace m3::loadgen {

namespace {

// 5x7 glyphs, one row per byte, the leftmost pixel in bit 4.
struct Glyph {
  char c;
  std::array<uint8_t, 7> rows;
};

constexpr Glyph kFont[] = {
    {'0', {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}}, {'1', {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'2', {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}}, {'3', {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E}},
    {'4', {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}}, {'5', {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E}},
    {'6', {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}}, {'7', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}},
    {'8', {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}}, {'9', {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}},
    {'A', {0x0E, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}}, {'B', {0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E}},
    {'C', {0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E}}, {'D', {0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C}},
    {'E', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F}}, {'F', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10}},
    {'G', {0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F}}, {'H', {0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}},
    {'I', {0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}}, {'J', {0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C}},
    {'K', {0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11}}, {'L', {0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F}},
    {'M', {0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11}}, {'N', {0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11}},
    {'O', {0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}}, {'P', {0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10}},
    {'Q', {0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D}}, {'R', {0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11}},
    {'S', {0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E}}, {'T', {0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04}},
    {'U', {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}}, {'V', {0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04}},
    {'W', {0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A}}, {'X', {0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11}},
    {'Y', {0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04}}, {'Z', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F}},
    {'.', {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C}}, {'-', {0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00}},
    {'/', {0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00}}, {':', {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00}},
    {'(', {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02}}, {')', {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08}},
    {'%', {0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03}}, {'+', {0x00, 0x04, 0x04, 0x1F, 0x04, 0x04, 0x00}},
    {'_', {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1F}}, {',', {0x00, 0x00, 0x00, 0x00, 0x0C, 0x04, 0x08}},
    {'=', {0x00, 0x00, 0x1F, 0x00, 0x1F, 0x00, 0x00}},
};

const Glyph* glyph(char c) {
  const char upper = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const Glyph& g : kFont) {
    if (g.c == upper) return &g;
  }
  return nullptr;
}

void put_u32(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((v >> shift) & 0xFF));
}

void put_chunk(std::string& out, const char type[5], const std::string& data) {
  put_u32(out, static_cast<uint32_t>(data.size()));
  std::string typed = std::string(type, 4) + data;
  out += typed;
  put_u32(out, crc32(reinterpret_cast<const uint8_t*>(typed.data()), typed.size()));
}

}  // namespace

Canvas::Canvas(int width, int height, Rgb background)
    : width_(width), height_(height), pixels_(static_cast<size_t>(width) * height, background) {}

void Canvas::set(int x, int y, Rgb c) {
  if (x >= 0 && y >= 0 && x < width_ && y < height_) pixels_[static_cast<size_t>(y) * width_ + x] = c;
}

void Canvas::fill_rect(int x0, int y0, int x1, int y1, Rgb c) {
  for (int y = std::min(y0, y1); y <= std::max(y0, y1); ++y)
    for (int x = std::min(x0, x1); x <= std::max(x0, x1); ++x) set(x, y, c);
}

void Canvas::line(double x0, double y0, double x1, double y1, Rgb c, int thickness) {
  // Steps of at most one pixel along the longer axis; each step stamps a thickness-wide square.
  const int steps = std::max(1, static_cast<int>(std::ceil(std::max(std::abs(x1 - x0), std::abs(y1 - y0)))));
  const int half = thickness / 2;
  for (int i = 0; i <= steps; ++i) {
    const double t = static_cast<double>(i) / steps;
    const int x = static_cast<int>(std::lround(x0 + (x1 - x0) * t));
    const int y = static_cast<int>(std::lround(y0 + (y1 - y0) * t));
    fill_rect(x - half, y - half, x - half + thickness - 1, y - half + thickness - 1, c);
  }
}

void Canvas::disc(double cx, double cy, double radius, Rgb c) {
  for (int y = static_cast<int>(cy - radius); y <= static_cast<int>(cy + radius) + 1; ++y)
    for (int x = static_cast<int>(cx - radius); x <= static_cast<int>(cx + radius) + 1; ++x)
      if ((x - cx) * (x - cx) + (y - cy) * (y - cy) <= radius * radius) set(x, y, c);
}

void Canvas::text(int x, int y, const std::string& s, Rgb c, int scale) {
  for (size_t i = 0; i < s.size(); ++i) {
    const Glyph* g = glyph(s[i]);
    if (g == nullptr) continue;
    const int left = x + static_cast<int>(i) * 6 * scale;
    for (int row = 0; row < 7; ++row)
      for (int col = 0; col < 5; ++col)
        if (g->rows[row] & (0x10 >> col))
          fill_rect(left + col * scale, y + row * scale, left + (col + 1) * scale - 1, y + (row + 1) * scale - 1, c);
  }
}

uint32_t crc32(const uint8_t* data, size_t size, uint32_t crc) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[n] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ data[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t adler32(const uint8_t* data, size_t size) {
  uint32_t a = 1, b = 0;
  for (size_t i = 0; i < size; ++i) {
    a = (a + data[i]) % 65521;
    b = (b + a) % 65521;
  }
  return (b << 16) | a;
}

namespace {

// Deflate with the fixed Huffman codes and one kind of match, a run of the byte before
// (distance 1): enough for a plot, whose rows are mostly equal to the row above (filter Up makes
// them zeros). Bits go out least significant first; Huffman codes most significant first.
class FixedDeflate {
 public:
  std::string out;

  void literal(uint8_t byte) {
    if (byte < 144) {
      code(0x30 + byte, 8);
    } else {
      code(0x190 + (byte - 144), 9);
    }
  }

  void run(int length) {  // 3..258 copies of the byte before
    static const int kBase[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                  31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
    static const int kExtra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
    int k = 28;
    while (kBase[k] > length) --k;
    symbol(257 + k);
    bits(static_cast<uint32_t>(length - kBase[k]), kExtra[k]);
    code(0, 5);  // distance code 0: distance 1
  }

  void begin() { bits(1, 1), bits(1, 2); }  // the last block, fixed codes
  void end() {
    symbol(256);
    if (used_ > 0) out.push_back(static_cast<char>(pending_));
  }

 private:
  void symbol(int s) {  // a length symbol or the end of the block
    if (s < 280) {
      code(static_cast<uint32_t>(s - 256), 7);
    } else {
      code(static_cast<uint32_t>(0xC0 + (s - 280)), 8);
    }
  }
  void code(uint32_t value, int n) {  // most significant bit first
    for (int i = n - 1; i >= 0; --i) bits((value >> i) & 1, 1);
  }
  void bits(uint32_t value, int n) {  // least significant bit first
    for (int i = 0; i < n; ++i) {
      pending_ |= ((value >> i) & 1) << used_;
      if (++used_ == 8) {
        out.push_back(static_cast<char>(pending_));
        pending_ = 0;
        used_ = 0;
      }
    }
  }
  uint32_t pending_ = 0;
  int used_ = 0;
};

std::string deflate_runs(const std::string& raw) {
  FixedDeflate d;
  d.begin();
  for (size_t i = 0; i < raw.size();) {
    size_t n = 0;
    if (i > 0) {
      while (n < 258 && i + n < raw.size() && raw[i + n] == raw[i - 1]) ++n;
    }
    if (n >= 3) {
      d.run(static_cast<int>(n));
      i += n;
    } else {
      d.literal(static_cast<uint8_t>(raw[i]));
      ++i;
    }
  }
  d.end();
  return d.out;
}

}  // namespace

std::string encode_png(const Canvas& canvas) {
  // Each row: filter 2 (Up: each byte minus the one above it), then its RGB bytes.
  std::string raw;
  raw.reserve(static_cast<size_t>(canvas.height()) * (1 + 3 * canvas.width()));
  for (int y = 0; y < canvas.height(); ++y) {
    raw.push_back(2);
    for (int x = 0; x < canvas.width(); ++x) {
      const Rgb p = canvas.at(x, y);
      const Rgb above = y > 0 ? canvas.at(x, y - 1) : Rgb{0, 0, 0};
      raw.push_back(static_cast<char>(static_cast<uint8_t>(p.r - above.r)));
      raw.push_back(static_cast<char>(static_cast<uint8_t>(p.g - above.g)));
      raw.push_back(static_cast<char>(static_cast<uint8_t>(p.b - above.b)));
    }
  }
  // zlib: header (deflate, 32K window, no dictionary), the deflate stream, Adler-32 of the raw bytes.
  std::string z = {0x78, 0x01};
  z += deflate_runs(raw);
  put_u32(z, adler32(reinterpret_cast<const uint8_t*>(raw.data()), raw.size()));

  std::string png = "\x89PNG\r\n\x1a\n";
  std::string header;
  put_u32(header, static_cast<uint32_t>(canvas.width()));
  put_u32(header, static_cast<uint32_t>(canvas.height()));
  header += std::string("\x08\x02\x00\x00\x00", 5);  // 8-bit, RGB, deflate, filter 0, no interlace
  put_chunk(png, "IHDR", header);
  put_chunk(png, "IDAT", z);
  put_chunk(png, "IEND", "");
  return png;
}

}  // namespace m3::loadgen
