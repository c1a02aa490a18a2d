// Eight float lanes, as the few-rows kernel computes with them: loads, fused
// multiply-adds and fixed-order lane sums.

#ifndef SPEC_DECODE_KERNELS_VEC8_H_
#define SPEC_DECODE_KERNELS_VEC8_H_

#include <cstdint>
#include <cstring>

#if defined(__FMA__)
#include <immintrin.h>
#endif

namespace vec8 {

typedef float Vec __attribute__((vector_size(32)));
constexpr int64_t kLanes = 8;

inline Vec Load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// acc + a * b, rounded once. The few-rows kernel accumulates through these
// alone: left to the compiler, a multiply and an add were fused in some of
// its loops and not in others (GCC 12, -O3), which changes the sums' bits.
inline Vec Fma(Vec a, Vec b, Vec acc) {
#if defined(__FMA__)
  return reinterpret_cast<Vec>(_mm256_fmadd_ps(reinterpret_cast<__m256>(a),
                                               reinterpret_cast<__m256>(b),
                                               reinterpret_cast<__m256>(acc)));
#else
  Vec out;
  for (int i = 0; i < kLanes; ++i) out[i] = __builtin_fmaf(a[i], b[i], acc[i]);
  return out;
#endif
}

inline float Fma(float a, float b, float acc) {
  return __builtin_fmaf(a, b, acc);
}

inline float LaneSum(Vec v) {
  // A fixed pairwise order: (0+4, 1+5, 2+6, 3+7), then (0+2, 1+3), then 0+1.
  float a[kLanes];
  std::memcpy(a, &v, sizeof(a));
  float b0 = a[0] + a[4], b1 = a[1] + a[5], b2 = a[2] + a[6], b3 = a[3] + a[7];
  return (b0 + b2) + (b1 + b3);
}

typedef int32_t Lanes __attribute__((vector_size(32)));

// LaneSum of each of v[0..8), into s[0..8): the same additions of the same
// lanes, in vector operations.
inline void LaneSums8(const Vec* v, float* s) {
  // b[i] = [v[2i] | v[2i+1]]'s lane k plus lane k + 4, for k < 4.
  Vec b[4];
  for (int i = 0; i < 4; ++i) {
    b[i] = __builtin_shuffle(v[2 * i], v[2 * i + 1],
                             Lanes{0, 1, 2, 3, 8, 9, 10, 11}) +
           __builtin_shuffle(v[2 * i], v[2 * i + 1],
                             Lanes{4, 5, 6, 7, 12, 13, 14, 15});
  }
  // c[i]: the (0+2, 1+3) sums of v[4i], v[4i+2] | v[4i+1], v[4i+3].
  Vec c[2];
  for (int i = 0; i < 2; ++i) {
    c[i] = __builtin_shuffle(b[2 * i], b[2 * i + 1],
                             Lanes{0, 1, 8, 9, 4, 5, 12, 13}) +
           __builtin_shuffle(b[2 * i], b[2 * i + 1],
                             Lanes{2, 3, 10, 11, 6, 7, 14, 15});
  }
  // d: the sums of v[0], v[2], v[4], v[6], v[1], v[3], v[5], v[7].
  const Vec d =
      __builtin_shuffle(c[0], c[1], Lanes{0, 2, 8, 10, 4, 6, 12, 14}) +
      __builtin_shuffle(c[0], c[1], Lanes{1, 3, 9, 11, 5, 7, 13, 15});
  const Vec ordered = __builtin_shuffle(d, Lanes{0, 4, 1, 5, 2, 6, 3, 7});
  std::memcpy(s, &ordered, sizeof(ordered));
}

// LaneSum of each of v[0..n), into s[0..n).
template <int n>
inline void LaneSums(const Vec* v, float* s) {
  for (int i = 0; i < n; i += 8) {
    Vec block[8];
    float sums[8];
    for (int j = 0; j < 8; ++j) block[j] = i + j < n ? v[i + j] : Vec{};
    LaneSums8(block, sums);
    for (int j = 0; j < 8 && i + j < n; ++j) s[i + j] = sums[j];
  }
}

// Keeps a loaded vector in its register: GCC otherwise folds the load into
// each FMA that reads it, so that an operand of several FMAs is loaded as
// many times.
inline void InRegister(Vec& v) { asm("" : "+v"(v)); }

}  // namespace vec8

#endif  // SPEC_DECODE_KERNELS_VEC8_H_
