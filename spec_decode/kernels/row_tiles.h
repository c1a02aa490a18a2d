// Products of 17-64 rows in register tiles, for the few-rows kernel
// (few_rows.cc): x [M, K] times w [N, K], a block of weight rows at a time.

#ifndef SPEC_DECODE_KERNELS_ROW_TILES_H_
#define SPEC_DECODE_KERNELS_ROW_TILES_H_

#include <cstdint>

#include "vec8.h"

namespace row_tiles {

using vec8::Fma;
using vec8::InRegister;
using vec8::LaneSums;
using vec8::Load;
using vec8::Vec;

// Products of this many rows or more (up to few_rows.MAX_ROWS) are computed
// in tiles instead (TileShare in few_rows.cc): an encoder's products at batch
// 1 (the demo's inputs are 16-48 tokens), a verification call's at batch 8.
// There each weight serves many rows, and the passes over groups of rows,
// with 2 + 2G loads for 2G FMAs, bound the arithmetic. With the demo target's
// weight matrices from DRAM, on a 2-core Zen 3 EPYC (benchmarks/row_tiles.py,
// 9 rounds in turn), 17-32 rows took 0.51-0.62 of XLA's dot's time by its
// [512, 512] and [2048, 512] weights and 0.78-0.93 by [512, 2048], 48-64 rows
// 0.81-1.03, and the demo's set-up 0.77 (README, "A twenty-third session").
constexpr int64_t kTileMinRows = 17;
// A tile's activation rows and weight rows: its pass holds kTileRows *
// kTileWeights accumulators, kTileWeights weight vectors and one activation
// vector, AVX2's 16 registers, and makes kTileRows + kTileWeights loads for
// kTileRows * kTileWeights FMAs.
constexpr int kTileRows = 4;
constexpr int kTileWeights = 3;

// Rows x[0..R) times weight rows [n, n + W), into out (row stride N). Each
// element is one 8-lane accumulator over k, then LaneSum's reduction and the
// scalar tail: the same operations in the same order whichever tile (R, W)
// computes it, so a row's result does not depend on M among the products of
// kTileMinRows rows or more. (The passes over groups of rows keep two
// accumulators an element, which a tile's registers cannot hold: their
// results differ from a tile's in the last bits.)
template <int R, int W>
void Tile(const float* x, const float* w, float* out, int64_t N, int64_t K,
          int64_t n) {
  const int64_t k8 = K / 8 * 8;
  const float* wn = w + n * K;
  Vec acc[R][W];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < W; ++c) acc[r][c] = Vec{};
  }
  for (int64_t k = 0; k < k8; k += 8) {
    Vec wv[W];
    for (int c = 0; c < W; ++c) {
      wv[c] = Load(wn + c * K + k);
      InRegister(wv[c]);
    }
    for (int r = 0; r < R; ++r) {
      Vec xv = Load(x + r * K + k);
      InRegister(xv);
      for (int c = 0; c < W; ++c) acc[r][c] = Fma(xv, wv[c], acc[r][c]);
    }
  }
  float sums[R * W];
  LaneSums<R * W>(&acc[0][0], sums);
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < W; ++c) {
      const float* wc = wn + c * K;
      float tail = 0.0f;
      for (int64_t k = k8; k < K; ++k) tail = Fma(x[r * K + k], wc[k], tail);
      out[r * N + n + c] = sums[r * W + c] + tail;
    }
  }
}

// The weights of a block, at most: a thread takes a block of weight rows at a
// time, which stays in L2 while every tile of activation rows passes over it.
constexpr int64_t kBlockFloats = 24 * 1024;

// Weight rows a block holds for rows of K weights: a multiple of kTileWeights.
inline int64_t BlockRows(int64_t K) {
  const int64_t rows = kBlockFloats / K / kTileWeights * kTileWeights;
  return rows < kTileWeights ? kTileWeights : rows;
}

// Prefetches `lines` cache lines from *cursor into L2, and advances it.
inline void PrefetchLines(const float*& cursor, const float* end,
                          int64_t lines) {
  for (int64_t i = 0; i < lines && cursor < end; ++i, cursor += 16) {
    __builtin_prefetch(cursor, 0, 2);
  }
}

// Rows x[0..R) times weight rows [n0, n1), a tile at a time, each tile
// prefetching `lines` lines of the thread's next block first.
template <int R>
void RowsTimesTiles(const float* x, const float* w, float* out, int64_t N,
                    int64_t K, int64_t n0, int64_t n1, const float*& cursor,
                    const float* end, int64_t lines) {
  int64_t n = n0;
  for (; n + kTileWeights <= n1; n += kTileWeights) {
    PrefetchLines(cursor, end, lines);
    Tile<R, kTileWeights>(x, w, out, N, K, n);
  }
  static_assert(kTileWeights == 3, "the cases below cover 1-2 weight rows");
  switch (n1 - n) {
    case 1: Tile<R, 1>(x, w, out, N, K, n); break;
    case 2: Tile<R, 2>(x, w, out, N, K, n); break;
    default: break;
  }
}

// Rows x[0..M) times the block of weight rows [n0, n1), while the weights
// [next, next_end) (the thread's next block) stream into L2: spread over the
// block's tiles, so that the memory and the arithmetic overlap.
inline void BlockTimesRows(const float* x, const float* w, float* out,
                           int64_t M, int64_t N, int64_t K, int64_t n0,
                           int64_t n1, const float* next,
                           const float* next_end) {
  const int64_t tiles = (M + kTileRows - 1) / kTileRows *
                        ((n1 - n0 + kTileWeights - 1) / kTileWeights);
  const int64_t lines = ((next_end - next) / 16 + tiles - 1) / tiles;
  const float* cursor = next;
  int64_t m = 0;
  for (; m + kTileRows <= M; m += kTileRows) {
    RowsTimesTiles<kTileRows>(x + m * K, w, out + m * N, N, K, n0, n1, cursor,
                              next_end, lines);
  }
  const float* xm = x + m * K;
  float* om = out + m * N;
  static_assert(kTileRows == 4, "the cases below cover 1-3 rows");
  switch (M - m) {
    case 1:
      RowsTimesTiles<1>(xm, w, om, N, K, n0, n1, cursor, next_end, lines);
      break;
    case 2:
      RowsTimesTiles<2>(xm, w, om, N, K, n0, n1, cursor, next_end, lines);
      break;
    case 3:
      RowsTimesTiles<3>(xm, w, om, N, K, n0, n1, cursor, next_end, lines);
      break;
    default: break;
  }
}

}  // namespace row_tiles

#endif  // SPEC_DECODE_KERNELS_ROW_TILES_H_
