// The attention of a decode call's few queries over its keys, on CPU: one
// custom call for all of an attention's rows, queries and heads.
//
// XLA:CPU runs a decode call's attention as about eight small ops per query
// and layer (the two dots, the softmax's fusions and its reductions), each a
// thunk of its own. In a jax.profiler trace of the demo pair's speculative
// loop on a 2-core Zen 3 EPYC they made about 570 of an iteration's 910
// thunks (README, "A twenty-second session").
//
// Each (row, query, head) is computed alone, in an order fixed by the head
// size alone, so a query's output is bit-identical whether it comes alone (a
// decode step) or among others (verification), and whatever the number of
// keys past its last valid one: a key's logit accumulates over the head's
// dimensions in order, in lane s % 8 of its block of 8 keys; the softmax's
// sum accumulates in those lanes over the blocks in order, then over the
// lanes; the values' product over the keys in order. A masked key's weight
// is an exact 0.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

typedef float Vec __attribute__((vector_size(32)));
constexpr int64_t kLanes = 8;
// spec_decode/models/attention.py's MASK_VALUE: a masked key's logit.
constexpr float kMaskValue = -1e10f;

// Offsets into an array broadcastable to [B, H, T, S]: 0 along a dimension
// of size 1.
struct Strides {
  int64_t b, h, t;
};

Strides BroadcastStrides(ffi::Span<const int64_t> dims) {
  const int64_t s = dims[3];
  return {dims[0] == 1 ? 0 : dims[1] * dims[2] * s,
          dims[1] == 1 ? 0 : dims[2] * s, dims[2] == 1 ? 0 : s};
}

// Blocks of 8 keys (or of 8 head dimensions) accumulated together: their
// sums are independent chains, which hide the additions' latency.
constexpr int64_t kBlocks = 8;

// logits[s] = sum over d in order of q[d] * k[d * stride + s], for the
// kN blocks of 8 keys from k on (a constant, so that the sums stay in
// registers).
template <int kN>
void KeyBlocks(const float* q, const float* k, int64_t D, int64_t stride,
               float* logits) {
  Vec acc[kN] = {};
  for (int64_t d = 0; d < D; ++d) {
    for (int j = 0; j < kN; ++j) {
      Vec keys;
      std::memcpy(&keys, k + d * stride + j * kLanes, sizeof(Vec));
      acc[j] += q[d] * keys;
    }
  }
  std::memcpy(logits, acc, kN * sizeof(Vec));
}

void KeyBlocks(const float* q, const float* k, int64_t D, int64_t stride,
               int64_t blocks, float* logits) {
  switch (blocks) {
    case 1: return KeyBlocks<1>(q, k, D, stride, logits);
    case 2: return KeyBlocks<2>(q, k, D, stride, logits);
    case 3: return KeyBlocks<3>(q, k, D, stride, logits);
    case 4: return KeyBlocks<4>(q, k, D, stride, logits);
    case 5: return KeyBlocks<5>(q, k, D, stride, logits);
    case 6: return KeyBlocks<6>(q, k, D, stride, logits);
    case 7: return KeyBlocks<7>(q, k, D, stride, logits);
    default: return KeyBlocks<8>(q, k, D, stride, logits);
  }
}

// logits[s] = sum over d in order of q[d] * k[d * S + s]. The last block's
// keys come from `tail`, [D, 8]: those of k[., S - S % 8 ..] padded with 0,
// so that each key's sum is computed as in a full block.
void QueryTimesKeys(const float* q, const float* k, int64_t D, int64_t S,
                    float* tail, float* logits) {
  const int64_t full = S / kLanes;
  for (int64_t j = 0; j < full; j += kBlocks) {
    const int64_t blocks = full - j < kBlocks ? full - j : kBlocks;
    KeyBlocks(q, k + j * kLanes, D, S, blocks, logits + j * kLanes);
  }
  const int64_t n = S - full * kLanes;
  if (n == 0) return;
  for (int64_t d = 0; d < D; ++d) {
    for (int64_t i = 0; i < kLanes; ++i) {
      tail[d * kLanes + i] = i < n ? k[d * S + full * kLanes + i] : 0.0f;
    }
  }
  KeyBlocks(q, tail, D, kLanes, 1, logits + full * kLanes);
}

typedef int32_t IntVec __attribute__((vector_size(32)));

// exp(x) in 8 lanes, within about 2 ulp of float32 exp (Cephes' expf: x =
// n ln 2 + r, |r| <= ln 2 / 2, a degree-6 polynomial in r, times 2^n);
// exactly 0 below -87.3, where float32 exp leaves the normal range, as for a
// masked key's logit.
Vec Exp(Vec x) {
  const Vec kMin = Vec{} - 87.3f, kMax = Vec{} + 88.7f;
  const IntVec zero = x < kMin;
  x = x < kMin ? kMin : x;
  x = x > kMax ? kMax : x;
  // n = round(x / ln 2), by adding and subtracting 1.5 * 2^23.
  const Vec kShift = Vec{} + 12582912.0f;
  const Vec n = (x * 1.44269504088896341f + kShift) - kShift;
  // r = x - n ln 2, ln 2 in two parts so that n * its first is exact.
  const Vec r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  Vec p = Vec{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^n as a float's exponent bits.
  const IntVec two_n = (__builtin_convertvector(n, IntVec) + 127) << 23;
  Vec scale;
  std::memcpy(&scale, &two_n, sizeof(Vec));
  const Vec e = p * scale;
  return zero ? Vec{} : e;
}

// The softmax's unnormalized weights exp(logit - max), in place over the
// S logits (and 0 over the 0-7 after them, to the end of their block). Their
// sum: 8 lanes of sums over the blocks in order, then the lanes in order.
float Exponentials(float* logits, int64_t S) {
  float top = logits[0];
  for (int64_t s = 1; s < S; ++s) top = logits[s] > top ? logits[s] : top;
  Vec sums = {};
  for (int64_t s0 = 0; s0 < S; s0 += kLanes) {
    Vec x;
    std::memcpy(&x, logits + s0, sizeof(Vec));
    Vec e = Exp(x - top);
    for (int64_t i = S - s0; i < kLanes; ++i) e[i] = 0.0f;
    std::memcpy(logits + s0, &e, sizeof(Vec));
    sums += e;
  }
  float total = 0.0f;
  for (int i = 0; i < kLanes; ++i) total += sums[i];
  return total;
}

// out[d] = sum over s in order of weights[s] * v[s * D + d], over total,
// for the kN blocks of 8 dimensions from v and out on.
template <int kN>
void ValueBlocks(const float* weights, const float* v, int64_t D, int64_t S,
                 float total, float* out) {
  Vec acc[kN] = {};
  for (int64_t s = 0; s < S; ++s) {
    for (int j = 0; j < kN; ++j) {
      Vec values;
      std::memcpy(&values, v + s * D + j * kLanes, sizeof(Vec));
      acc[j] += weights[s] * values;
    }
  }
  for (int j = 0; j < kN; ++j) acc[j] /= total;
  std::memcpy(out, acc, kN * sizeof(Vec));
}

void ValueBlocks(const float* weights, const float* v, int64_t D, int64_t S,
                 float total, int64_t blocks, float* out) {
  switch (blocks) {
    case 1: return ValueBlocks<1>(weights, v, D, S, total, out);
    case 2: return ValueBlocks<2>(weights, v, D, S, total, out);
    case 3: return ValueBlocks<3>(weights, v, D, S, total, out);
    case 4: return ValueBlocks<4>(weights, v, D, S, total, out);
    case 5: return ValueBlocks<5>(weights, v, D, S, total, out);
    case 6: return ValueBlocks<6>(weights, v, D, S, total, out);
    case 7: return ValueBlocks<7>(weights, v, D, S, total, out);
    default: return ValueBlocks<8>(weights, v, D, S, total, out);
  }
}

// out[d] = sum over s in order of weights[s] * v[s * D + d], over total.
void WeightsTimesValues(const float* weights, const float* v, int64_t D,
                        int64_t S, float total, float* out) {
  const int64_t full = D / kLanes;
  for (int64_t j = 0; j < full; j += kBlocks) {
    const int64_t blocks = full - j < kBlocks ? full - j : kBlocks;
    ValueBlocks(weights, v + j * kLanes, D, S, total, blocks,
                out + j * kLanes);
  }
  for (int64_t d = full * kLanes; d < D; ++d) {
    float acc = 0.0f;
    for (int64_t s = 0; s < S; ++s) acc += weights[s] * v[s * D + d];
    out[d] = acc / total;
  }
}

ffi::Error FewQueriesImpl(ffi::Buffer<ffi::F32> query,
                          ffi::Buffer<ffi::F32> key,
                          ffi::Buffer<ffi::F32> value,
                          ffi::Buffer<ffi::F32> bias,
                          ffi::Buffer<ffi::PRED> mask, bool has_bias,
                          ffi::ResultBuffer<ffi::F32> out) {
  const auto q_dims = query.dimensions();
  const auto k_dims = key.dimensions();
  const auto v_dims = value.dimensions();
  const auto b_dims = bias.dimensions();
  const auto m_dims = mask.dimensions();
  if (q_dims.size() != 4 || k_dims.size() != 4 || v_dims.size() != 4 ||
      b_dims.size() != 4 || m_dims.size() != 4) {
    return ffi::Error::InvalidArgument(
        "few_queries_attention: expected rank-4 operands");
  }
  const int64_t B = q_dims[0], T = q_dims[1], H = q_dims[2], D = q_dims[3];
  const int64_t S = k_dims[3];
  // Each of the bias's and the mask's first three dimensions is 1 or B, H
  // and T, so that BroadcastStrides stays within them.
  const int64_t bht[3] = {B, H, T};
  bool broadcastable = b_dims[3] == S && m_dims[3] == S;
  for (int i = 0; i < 3; ++i) {
    broadcastable &= (b_dims[i] == 1 || b_dims[i] == bht[i]) &&
                     (m_dims[i] == 1 || m_dims[i] == bht[i]);
  }
  if (k_dims[0] != B || k_dims[1] != H || k_dims[2] != D ||
      v_dims[0] != B || v_dims[1] != H || v_dims[2] != S || v_dims[3] != D ||
      !broadcastable) {
    return ffi::Error::InvalidArgument(
        "few_queries_attention: expected query [B, T, H, D], key [B, H, D, "
        "S], value [B, H, S, D], bias and mask broadcastable to [B, H, T, "
        "S]");
  }
  if (S == 0) {
    std::memset(out->typed_data(), 0, out->size_bytes());
    return ffi::Error::Success();
  }
  const Strides bias_at = BroadcastStrides(b_dims);
  const Strides mask_at = BroadcastStrides(m_dims);
  std::vector<float> logits(S + kLanes), tail(D * kLanes);
  // A head's keys and values stay in L1 while its queries read them.
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t t = 0; t < T; ++t) {
        const int64_t row = ((b * T + t) * H + h) * D;
        QueryTimesKeys(query.typed_data() + row,
                       key.typed_data() + (b * H + h) * D * S, D, S,
                       tail.data(), logits.data());
        const float* bias_row =
            bias.typed_data() + b * bias_at.b + h * bias_at.h + t * bias_at.t;
        const bool* mask_row =
            mask.typed_data() + b * mask_at.b + h * mask_at.h + t * mask_at.t;
        for (int64_t s = 0; s < S; ++s) {
          const float logit = has_bias ? logits[s] + bias_row[s] : logits[s];
          logits[s] = mask_row[s] ? logit : kMaskValue;
        }
        const float total = Exponentials(logits.data(), S);
        WeightsTimesValues(logits.data(),
                           value.typed_data() + (b * H + h) * S * D, D, S,
                           total, out->typed_data() + row);
      }
    }
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(FewQueriesAttention, FewQueriesImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Attr<bool>("has_bias")
                                  .Ret<ffi::Buffer<ffi::F32>>());
