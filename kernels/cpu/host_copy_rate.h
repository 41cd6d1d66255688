// This machine's memory bandwidth as a copy measures it: the CPU backend's measure_copy_rate
// (ops/backend.h), the rate its decode floor is counted at (m3serve bench latency --device cpu):
// what a step's weights and KV would take to stream from memory once.
#pragma once
#include <cstdint>

namespace m3 {

// Bytes read plus bytes written per second by the OpenMP threads (as many as the CPU backend's
// loops use) copying a buffer of `buffer_bytes`, best of `repeats` copies after one untimed copy
// that faults the pages in. The count matches the GPU's "copy 4.2 TB/s" figure.
double measure_host_copy_rate(int64_t buffer_bytes, int repeats);

}  // namespace m3
