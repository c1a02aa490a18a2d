// A few rows of activations times a weight matrix, on CPU, streaming the
// weights from memory once for all the rows.
//
//   out[m, n] = sum_k x[m, k] * w[n, k]      x [M, K], w [N, K], out [M, N]
//
// XLA:CPU computes this product for 2-8 rows at a fraction of the memory
// bound: 5 rows cost about 2.3 one-row products on a Zen 2 core, so a
// (gamma+1)-token verification call costs far more than one decode step,
// against Theorem 3.8's premise. Here each weight row w[n, :] is read from
// memory once and multiplied into up to 6 activation rows while it sits in
// L1; more rows take further passes over the same chunk of weight rows, which
// its first pass left in L2.
//
// Where the CPU has 32 vector registers (AVX-512), groups of 3-6 rows take two
// weight rows a pass (GroupTimesRowPairs), so that each activation load serves
// both.
//
// Every output element of a product of up to 16 rows is summed in the same
// order whatever M is and whichever thread computes it: two 8-lane
// accumulators over alternate 8-element chunks of k, then a fixed lane
// reduction. So a row's result is bit-identical whether it is computed alone
// (a decode step) or among others (verification).
//
// Products of 17 rows or more (an encoder's, a verification call's at batch 8)
// are computed in register tiles instead (row_tiles.h), with one accumulator
// an element: a row's result is then the same whatever M is among them, and
// differs from the few-rows passes' in the last bits.
//
// Every product of kSmallWeights weights or more, a single row's too, is
// split over chunks of weight rows among the threads of spin_pool.h, whose
// workers spin between products: one core streams the weights from DRAM
// slower than two. On a 2-core Zen 4 EPYC
// (32 MiB L3), the parameters on 2 MiB pages, the demo target's 1-token call
// took 1.75-1.80 ms so, against 2.95-3.05 ms on the calling thread alone
// (benchmarks/loop_overhead.py, the two run in turn). With OpenMP's threads,
// before spin_pool.h, a split single row had cost more (5.2 ms against 4.3).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "row_tiles.h"
#include "spin_pool.h"
#include "vec8.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using vec8::Fma;
using vec8::InRegister;
using vec8::LaneSum;
using vec8::Load;
using vec8::Vec;
using row_tiles::BlockRows;
using row_tiles::BlockTimesRows;
using row_tiles::kTileMinRows;

// Activation rows multiplied per pass over a weight row.
constexpr int64_t kMaxGroup = 6;
// Weight rows a thread takes at once.
constexpr int64_t kChunkRows = 64;
// Products of fewer weights than this run on the calling thread alone: a
// worker that joins them costs more than it saves. The demo's 1.8M draft,
// whose products are 64-256 KB but for its 2 MB logits, runs in the kernel
// so (README, "A tenth session"): in the speculative loop, on a 2-core Zen 4
// EPYC, 0.976 and 0.974 of the time with its products in XLA (two A/Bs in
// one process, 20 and 30 sentences). Split over the pool too, they had been
// slower than in XLA. The demo target's smallest products hold 256K weights.
constexpr int64_t kSmallWeights = 256 * 1024;
// How far ahead of its loads a pass over several activation rows prefetches
// the weights, in floats (1 KB). The hardware prefetcher alone lets the
// multiplications delay the stream: on one Zen 2 core a 512x512 product of 5
// rows then cost 1.58 one-row products, and 1.04 with a prefetch. A single
// row streams about 1.1x faster without it, so only passes over two rows or
// more prefetch. The prefetch is non-temporal (locality 0): weights read once
// per call then displace less of what stays cached between calls, and the
// demo target's 5-token call took 5.5-5.8 ms in the speculative loop against
// 6.1-6.2 with a temporal prefetch (benchmarks/loop_overhead.py, alternate
// runs). A fixed distance, not a number of weight rows: two rows ahead (4 KB
// for the 512-wide rows, 16 KB for the 2048-wide) made the demo target's
// products of 4 rows cost 5.32-5.82 ms against 4.76-5.16 at 1 KB, on a 2-core
// Zen 3 EPYC (a C harness of its decoder's products, every distance timed in
// turn, three runs); 1 row cost about the same at every distance (README,
// "An eleventh session").
constexpr int64_t kPrefetchFloats = 256;

// Rows x[0..G) times weight rows [n0, n1), into out (row stride N).
template <int G>
void GroupTimesRows(const float* x, const float* w, float* out, int64_t N,
                    int64_t K, int64_t n0, int64_t n1) {
  const int64_t k16 = K / 16 * 16, k8 = K / 8 * 8;
  for (int64_t n = n0; n < n1; ++n) {
    const float* wn = w + n * K;
    Vec even[G], odd[G];
    for (int g = 0; g < G; ++g) even[g] = odd[g] = Vec{};
    for (int64_t k = 0; k < k16; k += 16) {
      // 16 floats are one cache line.
      if (G > 1) __builtin_prefetch(wn + kPrefetchFloats + k, 0, 0);
      const Vec w0 = Load(wn + k), w1 = Load(wn + k + 8);
      for (int g = 0; g < G; ++g) {
        even[g] = Fma(Load(x + g * K + k), w0, even[g]);
        odd[g] = Fma(Load(x + g * K + k + 8), w1, odd[g]);
      }
    }
    if (k8 > k16) {
      const Vec w0 = Load(wn + k16);
      for (int g = 0; g < G; ++g) {
        even[g] = Fma(Load(x + g * K + k16), w0, even[g]);
      }
    }
    for (int g = 0; g < G; ++g) {
      float tail = 0.0f;
      for (int64_t k = k8; k < K; ++k) tail = Fma(x[g * K + k], wn[k], tail);
      out[g * N + n] = LaneSum(even[g] + odd[g]) + tail;
    }
  }
}

#if defined(__AVX512VL__)
// 32 vector registers hold a pass over two weight rows for up to kMaxGroup
// activation rows: 4G accumulators, 4 weight and 2 activation vectors. With
// AVX2's 16 they would spill.
constexpr bool kRowPairs = true;
#else
constexpr bool kRowPairs = false;
#endif
// Groups of fewer rows keep GroupTimesRows: for 2 rows the pairs were no
// faster in the demo target's calls.
constexpr int kMinPairGroup = 3;
// How far ahead of its loads a pass over two weight rows prefetches, in
// floats (8 KB), into L2 (prefetcht1). A pass over a pair runs at 82 GFLOP/s
// on a Zen 4 core with the weights in L2, against 54 for GroupTimesRows,
// whose 10 loads per 8 FMAs bind it; but from DRAM it waits on the weights
// unless they are fetched far ahead. In the demo target's calls on a 2-core
// Zen 4 EPYC (each kernel compiled apart, timed in turn, 15 rounds), its 4-
// and 5-token calls took 4.80 and 4.86 ms against 5.14 and 5.33 with
// GroupTimesRows; 6 and 16 KB ahead gave 4.69 and 4.97, and 4.92 and 4.91;
// 1 KB non-temporally, as GroupTimesRows prefetches, 7.75 and 8.01 in another
// run (README, "A twentieth session").
constexpr int64_t kPairPrefetchFloats = 2048;

// As GroupTimesRows, two weight rows at a time, so that each activation load
// serves both: a pass over 16 k makes 4 + 2G loads for 4G FMAs instead of
// 2 + 2G loads for 2G. Each output element is summed exactly as
// GroupTimesRows sums it (the same chains, FMAs, tail and lane reduction),
// so the two agree bit for bit and a row's result does not depend on which
// of them computed it.
template <int G>
void GroupTimesRowPairs(const float* x, const float* w, float* out, int64_t N,
                        int64_t K, int64_t n0, int64_t n1) {
  const int64_t k16 = K / 16 * 16, k8 = K / 8 * 8;
  int64_t n = n0;
  for (; n + 1 < n1; n += 2) {
    const float* wa = w + n * K;
    const float* wb = wa + K;
    Vec even_a[G], odd_a[G], even_b[G], odd_b[G];
    for (int g = 0; g < G; ++g) {
      even_a[g] = odd_a[g] = even_b[g] = odd_b[g] = Vec{};
    }
    for (int64_t k = 0; k < k16; k += 16) {
      __builtin_prefetch(wa + kPairPrefetchFloats + k, 0, 2);
      __builtin_prefetch(wb + kPairPrefetchFloats + k, 0, 2);
      Vec a0 = Load(wa + k), a1 = Load(wa + k + 8);
      Vec b0 = Load(wb + k), b1 = Load(wb + k + 8);
      InRegister(a0);
      InRegister(a1);
      InRegister(b0);
      InRegister(b1);
      for (int g = 0; g < G; ++g) {
        Vec x0 = Load(x + g * K + k), x1 = Load(x + g * K + k + 8);
        InRegister(x0);
        InRegister(x1);
        even_a[g] = Fma(x0, a0, even_a[g]);
        odd_a[g] = Fma(x1, a1, odd_a[g]);
        even_b[g] = Fma(x0, b0, even_b[g]);
        odd_b[g] = Fma(x1, b1, odd_b[g]);
      }
    }
    if (k8 > k16) {
      const Vec a0 = Load(wa + k16), b0 = Load(wb + k16);
      for (int g = 0; g < G; ++g) {
        const Vec x0 = Load(x + g * K + k16);
        even_a[g] = Fma(x0, a0, even_a[g]);
        even_b[g] = Fma(x0, b0, even_b[g]);
      }
    }
    for (int g = 0; g < G; ++g) {
      float tail_a = 0.0f, tail_b = 0.0f;
      for (int64_t k = k8; k < K; ++k) {
        tail_a = Fma(x[g * K + k], wa[k], tail_a);
        tail_b = Fma(x[g * K + k], wb[k], tail_b);
      }
      out[g * N + n] = LaneSum(even_a[g] + odd_a[g]) + tail_a;
      out[g * N + n + 1] = LaneSum(even_b[g] + odd_b[g]) + tail_b;
    }
  }
  if (n < n1) GroupTimesRows<G>(x, w, out, N, K, n, n1);
}

// Rows x[0..G) times weight rows [n0, n1), in pairs where the registers allow.
template <int G>
void Group(const float* x, const float* w, float* out, int64_t N, int64_t K,
           int64_t n0, int64_t n1) {
  if (kRowPairs && G >= kMinPairGroup) {
    GroupTimesRowPairs<G>(x, w, out, N, K, n0, n1);
  } else {
    GroupTimesRows<G>(x, w, out, N, K, n0, n1);
  }
}

void RowsTimesRows(const float* x, const float* w, float* out, int64_t M,
                   int64_t N, int64_t K, int64_t n0, int64_t n1) {
  // As few passes as groups of kMaxGroup allow, as even as possible: 8 = 4 + 4.
  const int64_t passes = (M + kMaxGroup - 1) / kMaxGroup;
  const int64_t group = (M + passes - 1) / passes;
  for (int64_t m = 0; m < M; m += group) {
    const float* xm = x + m * K;
    float* om = out + m * N;
    switch (M - m < group ? M - m : group) {
      case 1: Group<1>(xm, w, om, N, K, n0, n1); break;
      case 2: Group<2>(xm, w, om, N, K, n0, n1); break;
      case 3: Group<3>(xm, w, om, N, K, n0, n1); break;
      case 4: Group<4>(xm, w, om, N, K, n0, n1); break;
      case 5: Group<5>(xm, w, om, N, K, n0, n1); break;
      default: Group<6>(xm, w, om, N, K, n0, n1); break;
    }
  }
}

struct Product {
  const float* x;
  const float* w;
  float* out;
  int64_t M, N, K;
  // The next chunk of kChunkRows weight rows (of a product in tiles, the next
  // block) that no thread has taken.
  mutable std::atomic<int64_t> next_chunk{0};
};

// A thread's share of a Product of kTileMinRows rows or more: blocks of
// weight rows, each claimed one block ahead, so that the thread prefetches its
// next block while it multiplies the current one.
void TileShare(const Product& p) {
  const int64_t rows = BlockRows(p.K);
  // Block b's first weight row, or N past the last block.
  const auto start = [&p, rows](int64_t b) {
    return b * rows < p.N ? b * rows : p.N;
  };
  const auto claim = [&p]() {
    return p.next_chunk.fetch_add(1, std::memory_order_relaxed);
  };
  for (int64_t b = claim(); start(b) < p.N;) {
    const int64_t next = claim();
    BlockTimesRows(p.x, p.w, p.out, p.M, p.N, p.K, start(b), start(b + 1),
                   p.w + start(next) * p.K, p.w + start(next + 1) * p.K);
    b = next;
  }
}

// A thread's share of a Product: chunks of weight rows, taken one at a time
// until none is left. A thread the OS deschedules (XLA's own pool threads
// share these cores) then holds up one chunk, not a fixed half of the
// product. In a C harness of the demo target's 5-row decode call from DRAM,
// on a 2-core Zen 4 EPYC with a third thread busy 300 us in every 600, its
// products took 8.7 ms against 11.3 split in fixed halves (5.4-5.6 ms either
// way undisturbed); the demo's speedup did not move (greedy, gamma 4, two
// runs each: 1.34x and 1.36x against 1.35x and 1.35x). Every output element
// is computed the same way whichever thread takes its chunk.
void ProductShare(const void* job) {
  const Product& p = *static_cast<const Product*>(job);
  if (p.M >= kTileMinRows) {
    TileShare(p);
    return;
  }
  const int64_t num_chunks = (p.N + kChunkRows - 1) / kChunkRows;
  for (int64_t c = p.next_chunk.fetch_add(1, std::memory_order_relaxed);
       c < num_chunks;
       c = p.next_chunk.fetch_add(1, std::memory_order_relaxed)) {
    const int64_t n0 = c * kChunkRows;
    const int64_t n1 = n0 + kChunkRows < p.N ? n0 + kChunkRows : p.N;
    RowsTimesRows(p.x, p.w, p.out, p.M, p.N, p.K, n0, n1);
  }
}

ffi::Error FewRowsImpl(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                       ffi::ResultBuffer<ffi::F32> out) {
  const auto x_dims = x.dimensions();
  const auto w_dims = w.dimensions();
  if (x_dims.size() < 1 || w_dims.size() != 2 ||
      x_dims.back() != w_dims[1]) {
    return ffi::Error::InvalidArgument(
        "few_rows_product: expected x [..., K] and w [N, K]");
  }
  const int64_t K = w_dims[1], N = w_dims[0];
  if (N == 0) return ffi::Error::Success();
  const int64_t M = static_cast<int64_t>(out->element_count()) / N;
  if (K == 0) {
    std::memset(out->typed_data(), 0, out->size_bytes());
    return ffi::Error::Success();
  }
  const Product product{x.typed_data(), w.typed_data(), out->typed_data(),
                        M, N, K};
  if (N * K < kSmallWeights) {
    ProductShare(&product);
  } else {
    spin_pool::Shared().Run(ProductShare, &product);
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(FewRowsProduct, FewRowsImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
