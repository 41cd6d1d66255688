// The host side of nccl_communicator_check: each rank's random inputs, the collectives' results
// computed on the host from them, and the comparisons with their tolerances. No CUDA here.
//
// Tolerances of sums (the order NCCL adds in is its own: ring, tree, ... chosen per size):
//  - one rank: the input, bit for bit;
//  - F32 and BF16 over n ranks: n - 1 additions, each rounding its partial sum s to nearest, an
//    error of at most u |s| with u = 2^-24 (F32) or 2^-8 (BF16: 8 significant bits), and every
//    |s| <= sum_r |x_r|; so |got - exact| <= (n - 1) u sum_r |x_r|;
//  - BF16 over 2 ranks, tighter: one rounding of the exact sum a + b, within half a bf16 ulp of
//    it; the check allows one ulp (of |a + b|; the least normal's ulp when that is 0).
// I32 sums and every max are exact. `exact` sums in double, exact for these inputs.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "parallel/communicator.h"

namespace m3::test {

using Bytes = std::vector<uint8_t>;

// `numel` elements of `dtype` for `rank` in case `case_id`: the same bytes on every thread that
// asks, so each rank computes every other rank's inputs itself. F32 uniform in [-1, 1], BF16 that
// rounded to bf16, I32 uniform in [-1000, 1000], other dtypes random bytes.
Bytes random_input(DType dtype, int64_t numel, uint64_t seed, int case_id, int rank);

struct Verdict {
  bool ok = true;
  std::string detail;  // the worst element, or why it failed
};

// `got` (`numel` elements) against `op` over the ranks' `inputs` at elements [offset, offset + numel).
Verdict check_reduction(DType dtype, ReduceOp op, const std::vector<Bytes>& inputs, int64_t offset, int64_t numel,
                        const Bytes& got);
Verdict check_bytes(const Bytes& expected, const Bytes& got);

}  // namespace m3::test
