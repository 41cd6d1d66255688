// A tiny RGB raster (lines, discs, rectangles, text in a built-in 5x7 bitmap font) and its PNG
// encoding: rows filtered Up, deflated with the fixed Huffman codes and runs of the byte before
// (a plot is mostly rows equal to the one above), CRC-32 and Adler-32 written out here, so the
// plot needs no image library.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace m3::loadgen {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
};

class Canvas {
 public:
  Canvas(int width, int height, Rgb background);
  int width() const { return width_; }
  int height() const { return height_; }
  Rgb at(int x, int y) const { return pixels_[static_cast<size_t>(y) * width_ + x]; }

  void set(int x, int y, Rgb c);  // clipped
  void fill_rect(int x0, int y0, int x1, int y1, Rgb c);
  void line(double x0, double y0, double x1, double y1, Rgb c, int thickness = 1);
  void disc(double cx, double cy, double radius, Rgb c);
  // Text with its top-left corner at (x, y), each font pixel `scale` pixels wide; lower-case is
  // drawn as upper-case, characters without a glyph as a blank.
  void text(int x, int y, const std::string& s, Rgb c, int scale = 1);
  static int text_width(const std::string& s, int scale = 1) { return static_cast<int>(s.size()) * 6 * scale; }
  static int text_height(int scale = 1) { return 7 * scale; }

 private:
  int width_, height_;
  std::vector<Rgb> pixels_;
};

uint32_t crc32(const uint8_t* data, size_t size, uint32_t crc = 0);
uint32_t adler32(const uint8_t* data, size_t size);
// The canvas as a PNG file (8-bit RGB, filter Up on every row).
std::string encode_png(const Canvas& canvas);

}  // namespace m3::loadgen
