#include "kernels/cpu/cpu_vec.h"

namespace m3::cpu {

float dot_portable(const float* a, const float* b, int n) {
  float lane[8] = {};
  const int n8 = n & ~7;
  for (int i = 0; i < n8; i += 8)
    for (int l = 0; l < 8; ++l) lane[l] += a[i + l] * b[i + l];
  float acc = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
  for (int i = n8; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

void add_scaled_portable(float p, const float* x, float* y, int n) {
  for (int i = 0; i < n; ++i) y[i] += p * x[i];
}

#if defined(__x86_64__)
bool vec_avx2() {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
}

float dot(const float* a, const float* b, int n) {
  return vec_avx2() ? dot_avx2(a, b, n) : dot_portable(a, b, n);
}

void dot8(const float* a, const float* const b[8], int n, float out[8]) {
  if (vec_avx2()) return dots_avx2<8>(a, b, n, out);
  for (int j = 0; j < 8; ++j) out[j] = dot_portable(a, b[j], n);
}

void add_scaled8(const float* p, const float* const x[8], float* y, int n) {
  if (vec_avx2()) return add_scaled_rows_avx2<8>(p, x, y, n);
  for (int j = 0; j < 8; ++j) add_scaled_portable(p[j], x[j], y, n);
}

void add_scaled(float p, const float* x, float* y, int n) {
  if (vec_avx2())
    add_scaled_avx2(p, x, y, n);
  else
    add_scaled_portable(p, x, y, n);
}
#else
bool vec_avx2() { return false; }
float dot(const float* a, const float* b, int n) { return dot_portable(a, b, n); }
void dot8(const float* a, const float* const b[8], int n, float out[8]) {
  for (int j = 0; j < 8; ++j) out[j] = dot_portable(a, b[j], n);
}
void add_scaled(float p, const float* x, float* y, int n) { add_scaled_portable(p, x, y, n); }
void add_scaled8(const float* p, const float* const x[8], float* y, int n) {
  for (int j = 0; j < 8; ++j) add_scaled_portable(p[j], x[j], y, n);
}
#endif

}  // namespace m3::cpu
