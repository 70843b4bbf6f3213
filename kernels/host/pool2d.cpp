// Host max and average pooling (see kernels/pool2d.hpp). One task per block of planes: the
// windows of a plane may overlap in the backward pass, those of two planes never do.
#include "kernels/pool2d.hpp"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/host/parallel.hpp"

// The zero fills here cover a column or two per row; GCC would make each a memset call, which
// costs more than the stores (see kernels/host/conv2d.cpp).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-tree-loop-distribute-patterns")
#endif

namespace mpt::kernels::host {

namespace {

// The number of planes of X and Y, after checking that both hold whole planes of one count.
std::int64_t plane_count(const char* op, const Tensor& x, const Pool2dGeometry& g,
                         const Tensor& y) {
  const std::int64_t in_plane = g.height * g.width, out_plane = g.out_height() * g.out_width();
  detail::require_pair(
      g.kernel_h >= 1 && g.kernel_w >= 1 && g.stride >= 1 && g.kernel_h <= g.height &&
          g.kernel_w <= g.width && x.numel() % in_plane == 0 &&
          y.numel() == x.numel() / in_plane * out_plane,
      op, "tensors must hold the same number of whole input and output planes", x, y);
  return x.numel() / in_plane;
}
std::int64_t check_planes(const char* op, const Tensor& x, const Pool2dGeometry& g,
                          const Tensor& y) {
  detail::require_host_f32(op, "input must be f32 on the host", x);
  detail::require_host_f32(op, "output must be f32 on the host", y);
  return plane_count(op, x, g, y);
}

// Max pooling only selects, so it runs on any storage dtype through an ORDER: an element's
// key, ordered as the values are, and the two NaN rules. The forward takes a larger value or
// any NaN (so the last NaN of a window is its result); the backward takes a larger value, or a
// NaN when none came before (the first NaN takes the gradient). Both keep the first of equal
// maxima, -0 and +0 included. Bitwise, not short-circuit, so the loops have no branch and
// vectorise.
struct F32Order {
  using Bits = float;
  using Key = float;
  static Key key(float v) { return v; }
  static bool forward_takes(Key k, Key best) { return (k > best) | (k != k); }
  static bool backward_takes(Key k, Key best) { return (k > best) | ((k != k) & (best == best)); }
  // The gradient's bits where TAP won, else +0.
  static float routed(float grad, std::uint32_t best_tap, std::uint32_t tap) {
    return std::bit_cast<float>(std::bit_cast<std::uint32_t>(grad) &
                                (0u - static_cast<std::uint32_t>(best_tap == tap)));
  }
};

// f16 and bf16 (sign, exponent, mantissa; INF the magnitude bits of infinity): the key is the
// signed magnitude, so -0 and +0 tie as in float compares, and every NaN maps above every
// number. The results are the bits of the chosen elements: exact, as through f32.
template <std::int32_t kInfBits>
struct HalfOrder {
  using Bits = std::uint16_t;
  using Key = std::int32_t;
  static constexpr Key kInf = kInfBits;
  static constexpr Key kNaN = 0x8000;
  static Key key(std::uint16_t b) {
    const Key magnitude = b & 0x7fff;
    const Key value = (b & 0x8000) ? -magnitude : magnitude;
    return magnitude > kInf ? kNaN : value;
  }
  static bool forward_takes(Key k, Key best) { return (k > best) | (k == kNaN); }
  static bool backward_takes(Key k, Key best) { return k > best; }
  static std::uint16_t routed(std::uint16_t grad, std::uint32_t best_tap, std::uint32_t tap) {
    return static_cast<std::uint16_t>(grad & (0u - static_cast<std::uint32_t>(best_tap == tap)));
  }
};
using F16Order = HalfOrder<0x7c00>;
using BF16Order = HalfOrder<0x7f80>;

// A stretch of an output row at a time: the running maximum's key and the tap it came from
// live in these, for one plane's row; the values go straight to the output.
constexpr std::int64_t kStretch = 256;

template <class Order>
void max_forward_planes(const typename Order::Bits* in, typename Order::Bits* out,
                        const Pool2dGeometry& g, std::int64_t begin, std::int64_t end) {
  using Bits = typename Order::Bits;
  using Key = typename Order::Key;
  const std::int64_t oh_n = g.out_height(), ow_n = g.out_width();
  Key best_key[kStretch];
  for (std::int64_t p = begin; p < end; ++p) {
    const Bits* src = in + p * g.height * g.width;
    Bits* dst = out + p * oh_n * ow_n;
    // Window tap by window tap over a stretch of an output row: the inner loop runs over
    // outputs, without branches, and vectorises.
    for (std::int64_t oh = 0; oh < oh_n; ++oh)
      for (std::int64_t ow0 = 0; ow0 < ow_n; ow0 += kStretch) {
        const std::int64_t n = std::min(kStretch, ow_n - ow0);
        Bits* best = dst + oh * ow_n + ow0;
        const Bits* top = src + oh * g.stride * g.width + ow0 * g.stride;
        for (std::int64_t o = 0; o < n; ++o) {
          best[o] = top[o * g.stride];
          best_key[o] = Order::key(best[o]);
        }
        for (std::int64_t i = 0; i < g.kernel_h; ++i)
          for (std::int64_t j = i == 0 ? 1 : 0; j < g.kernel_w; ++j) {
            const Bits* tap = top + i * g.width + j;
            if constexpr (std::is_same_v<Key, Bits>) {  // f32: the output row is the key
              for (std::int64_t o = 0; o < n; ++o) {
                const Bits v = tap[o * g.stride];
                best[o] = Order::forward_takes(v, best[o]) ? v : best[o];
              }
              continue;
            }
            for (std::int64_t o = 0; o < n; ++o) {
              const Bits v = tap[o * g.stride];
              const Key k = Order::key(v);
              const bool take = Order::forward_takes(k, best_key[o]);
              best_key[o] = take ? k : best_key[o];
              best[o] = take ? v : best[o];
            }
          }
      }
  }
}

// The usual maxpool:2 on 16-bit storage: a window row is one 32-bit word (the low half first,
// little-endian), so the loads are contiguous words rather than stride-2 halves, which GCC
// does not vectorise, and all the arithmetic is on 32-bit lanes. Three clones, chosen at run
// time (pool_isa): AVX-512 written with intrinsics, and the portable bodies below inlined into
// an AVX2 clone and a baseline one (SSE2 cannot narrow 32-bit lanes to 16 bits, so the
// baseline's forward stores stay scalar).
inline std::uint32_t load_word(const std::uint16_t* at) {
  std::uint32_t word;
  std::memcpy(&word, at, sizeof word);
  return word;
}
inline void store_word(std::uint16_t* at, std::uint32_t word) {
  std::memcpy(at, &word, sizeof word);
}

// The forward's result for a 2x2 window, TOP and BOTTOM its rows' words: the bits of the last
// NaN, else of the first maximum.
template <class Order>
[[gnu::always_inline]] inline std::uint32_t forward_pick(std::uint32_t top, std::uint32_t bottom) {
  const std::uint32_t taps[4] = {top & 0xffffu, top >> 16, bottom & 0xffffu, bottom >> 16};
  auto best = Order::key(static_cast<std::uint16_t>(taps[0]));
  std::uint32_t bits = taps[0];
  for (int t = 1; t < 4; ++t) {
    const auto k = Order::key(static_cast<std::uint16_t>(taps[t]));
    const bool take = Order::forward_takes(k, best);
    best = take ? k : best;
    bits = take ? taps[t] : bits;
  }
  return bits;
}

template <class Order>
[[gnu::always_inline]] inline void max_forward_rows_2x2(const std::uint16_t* __restrict top,
                                                        const std::uint16_t* __restrict bottom,
                                                        std::uint16_t* __restrict row,
                                                        std::int64_t n) {
  for (std::int64_t o = 0; o < n; ++o) {
    row[o] = static_cast<std::uint16_t>(
        forward_pick<Order>(load_word(top + 2 * o), load_word(bottom + 2 * o)));
  }
}

template <class Order>
[[gnu::always_inline]] inline void max_backward_rows_2x2(const std::uint16_t* __restrict top,
                                                         const std::uint16_t* __restrict bottom,
                                                         const std::uint16_t* __restrict share,
                                                         std::uint16_t* __restrict dtop,
                                                         std::uint16_t* __restrict dbottom,
                                                         std::int64_t n) {
  // The backward's rule is the first of the largest keys (a NaN's key is above every number's,
  // so the first NaN), written with masks: GCC does not vectorise the forward's running selects
  // when it must also track which tap won.
  for (std::int64_t o = 0; o < n; ++o) {
    const std::uint32_t t = load_word(top + 2 * o), b = load_word(bottom + 2 * o);
    const auto k0 = Order::key(static_cast<std::uint16_t>(t)),
               k1 = Order::key(static_cast<std::uint16_t>(t >> 16)),
               k2 = Order::key(static_cast<std::uint16_t>(b)),
               k3 = Order::key(static_cast<std::uint16_t>(b >> 16));
    const auto most = std::max(std::max(k0, k1), std::max(k2, k3));
    const std::uint32_t w0 = 0u - static_cast<std::uint32_t>(k0 == most);
    const std::uint32_t w1 = ~w0 & (0u - static_cast<std::uint32_t>(k1 == most));
    const std::uint32_t w2 = ~(w0 | w1) & (0u - static_cast<std::uint32_t>(k2 == most));
    const std::uint32_t w3 = ~(w0 | w1 | w2);
    // The gradient's bits in the winner's half of the winner's row, 0 elsewhere.
    const std::uint32_t g = share[o];
    store_word(dtop + 2 * o, (g & w0) | ((g << 16) & w1));
    store_word(dbottom + 2 * o, (g & w2) | ((g << 16) & w3));
  }
}

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_epi32(), which -Wmaybe-uninitialized
// reports once inlined (GCC bug 105593, fixed in GCC 13).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// AVX-512 (F, BW, VL): sixteen outputs per vector, 32-bit lanes, and a row's tail under a mask,
// so that the short rows of small planes (14 and 7 outputs in the cnn) never fall to scalar
// code. The same keys and rules as Order's, lane by lane.
template <class Order>
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512i keys_512(__m512i bits) {
  const __m512i magnitude = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fff));
  const __mmask16 negative = _mm512_test_epi32_mask(bits, _mm512_set1_epi32(0x8000));
  const __m512i value =
      _mm512_mask_sub_epi32(magnitude, negative, _mm512_setzero_si512(), magnitude);
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(magnitude, _mm512_set1_epi32(Order::kInf));
  return _mm512_mask_mov_epi32(value, nan, _mm512_set1_epi32(Order::kNaN));
}

template <class Order>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void max_forward_rows_2x2_avx512(
    const std::uint16_t* top, const std::uint16_t* bottom, std::uint16_t* row, std::int64_t n) {
  const __m512i low = _mm512_set1_epi32(0xffff), nan_key = _mm512_set1_epi32(Order::kNaN);
  for (std::int64_t o = 0; o < n; o += 16) {
    const __mmask16 lanes = n - o >= 16 ? 0xffff : static_cast<__mmask16>((1u << (n - o)) - 1);
    const __m512i t = _mm512_maskz_loadu_epi32(lanes, top + 2 * o);
    const __m512i b = _mm512_maskz_loadu_epi32(lanes, bottom + 2 * o);
    const __m512i taps[4] = {_mm512_and_si512(t, low), _mm512_srli_epi32(t, 16),
                             _mm512_and_si512(b, low), _mm512_srli_epi32(b, 16)};
    __m512i best = keys_512<Order>(taps[0]), bits = taps[0];
    for (int i = 1; i < 4; ++i) {
      const __m512i k = keys_512<Order>(taps[i]);
      const __mmask16 take = _mm512_cmpgt_epi32_mask(k, best) | _mm512_cmpeq_epi32_mask(k, nan_key);
      best = _mm512_mask_mov_epi32(best, take, k);
      bits = _mm512_mask_mov_epi32(bits, take, taps[i]);
    }
    _mm256_mask_storeu_epi16(row + o, lanes, _mm512_cvtepi32_epi16(bits));
  }
}

template <class Order>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void max_backward_rows_2x2_avx512(
    const std::uint16_t* top, const std::uint16_t* bottom, const std::uint16_t* share,
    std::uint16_t* dtop, std::uint16_t* dbottom, std::int64_t n) {
  const __m512i low = _mm512_set1_epi32(0xffff);
  for (std::int64_t o = 0; o < n; o += 16) {
    const __mmask16 lanes = n - o >= 16 ? 0xffff : static_cast<__mmask16>((1u << (n - o)) - 1);
    const __m512i t = _mm512_maskz_loadu_epi32(lanes, top + 2 * o);
    const __m512i b = _mm512_maskz_loadu_epi32(lanes, bottom + 2 * o);
    const __m512i k0 = keys_512<Order>(_mm512_and_si512(t, low));
    const __m512i k1 = keys_512<Order>(_mm512_srli_epi32(t, 16));
    const __m512i k2 = keys_512<Order>(_mm512_and_si512(b, low));
    const __m512i k3 = keys_512<Order>(_mm512_srli_epi32(b, 16));
    const __m512i most = _mm512_max_epi32(_mm512_max_epi32(k0, k1), _mm512_max_epi32(k2, k3));
    // The first of the largest keys: the backward's rule.
    const __mmask16 w0 = _mm512_cmpeq_epi32_mask(k0, most);
    const __mmask16 w1 = _mm512_cmpeq_epi32_mask(k1, most) & ~w0;
    const __mmask16 w2 = _mm512_cmpeq_epi32_mask(k2, most) & ~(w0 | w1);
    const __mmask16 w3 = ~(w0 | w1 | w2);
    const __m512i g = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(lanes, share + o));
    const __m512i high = _mm512_slli_epi32(g, 16);
    _mm512_mask_storeu_epi32(dtop + 2 * o, lanes,
                             _mm512_mask_mov_epi32(_mm512_maskz_mov_epi32(w0, g), w1, high));
    _mm512_mask_storeu_epi32(dbottom + 2 * o, lanes,
                             _mm512_mask_mov_epi32(_mm512_maskz_mov_epi32(w2, g), w3, high));
  }
}

// f32 maxpool:2 in AVX-512F: a window row is two floats, so sixteen outputs read two vectors
// per input row, split into even and odd columns (and woven back for the backward's stores);
// masked tails as above. The forward and backward rules are F32Order's, lane by lane.
struct Lanes32 {
  __mmask16 outputs, first, second;  // N outputs; the 2N floats of a row over two vectors
};
inline Lanes32 lanes_for(std::int64_t n) {
  const auto mask = [](std::int64_t bits) {
    return static_cast<__mmask16>(bits >= 16 ? 0xffffu
                                             : (1u << std::max<std::int64_t>(0, bits)) - 1u);
  };
  return {mask(n), mask(2 * n), mask(2 * n - 16)};
}

// The four taps of up to sixteen windows, row-major, whose rows start at TOP and BOTTOM: each
// row's floats under M, split into even and odd columns.
__attribute__((target("avx512f"))) inline void window_taps(const float* top, const float* bottom,
                                                           const Lanes32& m, __m512 taps[4]) {
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  const __m512 rows[2][2] = {
      {_mm512_maskz_loadu_ps(m.first, top), _mm512_maskz_loadu_ps(m.second, top + 16)},
      {_mm512_maskz_loadu_ps(m.first, bottom), _mm512_maskz_loadu_ps(m.second, bottom + 16)}};
  for (int r = 0; r < 2; ++r) {
    taps[2 * r] = _mm512_permutex2var_ps(rows[r][0], even, rows[r][1]);
    taps[2 * r + 1] = _mm512_permutex2var_ps(rows[r][0], odd, rows[r][1]);
  }
}

__attribute__((target("avx512f"))) void max_forward_rows_2x2_f32_avx512(const float* top,
                                                                        const float* bottom,
                                                                        float* row,
                                                                        std::int64_t n) {
  for (std::int64_t o = 0; o < n; o += 16) {
    const Lanes32 m = lanes_for(n - o);
    __m512 taps[4];
    window_taps(top + 2 * o, bottom + 2 * o, m, taps);
    __m512 best = taps[0];
    for (int i = 1; i < 4; ++i) {  // a larger value, or any NaN
      const __mmask16 take = _mm512_cmp_ps_mask(taps[i], best, _CMP_GT_OQ) |
                             _mm512_cmp_ps_mask(taps[i], taps[i], _CMP_UNORD_Q);
      best = _mm512_mask_mov_ps(best, take, taps[i]);
    }
    _mm512_mask_storeu_ps(row + o, m.outputs, best);
  }
}

__attribute__((target("avx512f"))) void max_backward_rows_2x2_f32_avx512(
    const float* top, const float* bottom, const float* share, float* dtop, float* dbottom,
    std::int64_t n) {
  // Weaving A (even columns) and B (odd) back: the first 16 floats, then the next 16.
  const __m512i weave_lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i weave_hi =
      _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
  for (std::int64_t o = 0; o < n; o += 16) {
    const Lanes32 m = lanes_for(n - o);
    __m512 taps[4];
    window_taps(top + 2 * o, bottom + 2 * o, m, taps);
    // The running maximum and which tap won: a larger value, or a NaN when none came before.
    __m512 best = taps[0];
    __mmask16 won[4] = {0xffff, 0, 0, 0};
    for (int i = 1; i < 4; ++i) {
      const __mmask16 take = _mm512_cmp_ps_mask(taps[i], best, _CMP_GT_OQ) |
                             (_mm512_cmp_ps_mask(taps[i], taps[i], _CMP_UNORD_Q) &
                              _mm512_cmp_ps_mask(best, best, _CMP_ORD_Q));
      best = _mm512_mask_mov_ps(best, take, taps[i]);
      for (int j = 0; j < i; ++j) won[j] = static_cast<__mmask16>(won[j] & ~take);
      won[i] = take;
    }
    // The gradient's bits where its tap won, +0 elsewhere.
    const __m512 g = _mm512_maskz_loadu_ps(m.outputs, share + o);
    const __m512 routed[4] = {_mm512_maskz_mov_ps(won[0], g), _mm512_maskz_mov_ps(won[1], g),
                              _mm512_maskz_mov_ps(won[2], g), _mm512_maskz_mov_ps(won[3], g)};
    _mm512_mask_storeu_ps(dtop + 2 * o, m.first,
                          _mm512_permutex2var_ps(routed[0], weave_lo, routed[1]));
    _mm512_mask_storeu_ps(dtop + 2 * o + 16, m.second,
                          _mm512_permutex2var_ps(routed[0], weave_hi, routed[1]));
    _mm512_mask_storeu_ps(dbottom + 2 * o, m.first,
                          _mm512_permutex2var_ps(routed[2], weave_lo, routed[3]));
    _mm512_mask_storeu_ps(dbottom + 2 * o + 16, m.second,
                          _mm512_permutex2var_ps(routed[2], weave_hi, routed[3]));
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// The widest clone this CPU runs, capped by limit_pool_isa.
PoolIsa cpu_pool_isa() {
  static const PoolIsa isa = __builtin_cpu_supports("avx512f") &&
                                     __builtin_cpu_supports("avx512bw") &&
                                     __builtin_cpu_supports("avx512vl")
                                 ? PoolIsa::avx512
                             : __builtin_cpu_supports("avx2") ? PoolIsa::avx2
                                                              : PoolIsa::baseline;
  return isa;
}
std::atomic<PoolIsa> pool_isa_limit{PoolIsa::avx512};

// The AVX2 and baseline clones of the portable bodies, one pair per order.
template <class Order>
__attribute__((target("avx2"))) void max_forward_rows_2x2_avx2(const std::uint16_t* top,
                                                               const std::uint16_t* bottom,
                                                               std::uint16_t* row, std::int64_t n) {
  max_forward_rows_2x2<Order>(top, bottom, row, n);
}
template <class Order>
void max_forward_rows_2x2_base(const std::uint16_t* top, const std::uint16_t* bottom,
                               std::uint16_t* row, std::int64_t n) {
  max_forward_rows_2x2<Order>(top, bottom, row, n);
}
template <class Order>
__attribute__((target("avx2"))) void max_backward_rows_2x2_avx2(
    const std::uint16_t* top, const std::uint16_t* bottom, const std::uint16_t* share,
    std::uint16_t* dtop, std::uint16_t* dbottom, std::int64_t n) {
  max_backward_rows_2x2<Order>(top, bottom, share, dtop, dbottom, n);
}
template <class Order>
void max_backward_rows_2x2_base(const std::uint16_t* top, const std::uint16_t* bottom,
                                const std::uint16_t* share, std::uint16_t* dtop,
                                std::uint16_t* dbottom, std::int64_t n) {
  max_backward_rows_2x2<Order>(top, bottom, share, dtop, dbottom, n);
}

// The 16-bit rows function of the clone pool_isa() picks.
template <class Order>
auto forward_rows_2x2() {
  const PoolIsa isa = pool_isa();
  return isa == PoolIsa::avx512 ? max_forward_rows_2x2_avx512<Order>
         : isa == PoolIsa::avx2 ? max_forward_rows_2x2_avx2<Order>
                                : max_forward_rows_2x2_base<Order>;
}
template <class Order>
auto backward_rows_2x2() {
  const PoolIsa isa = pool_isa();
  return isa == PoolIsa::avx512 ? max_backward_rows_2x2_avx512<Order>
         : isa == PoolIsa::avx2 ? max_backward_rows_2x2_avx2<Order>
                                : max_backward_rows_2x2_base<Order>;
}

// maxpool:2 over planes [BEGIN, END), a row of outputs at a time through ROWS.
template <class Bits, class Rows>
void max_forward_planes_2x2(const Bits* in, Bits* out, const Pool2dGeometry& g, std::int64_t begin,
                            std::int64_t end, Rows rows) {
  const std::int64_t oh_n = g.out_height(), ow_n = g.out_width();
  for (std::int64_t p = begin; p < end; ++p) {
    const Bits* src = in + p * g.height * g.width;
    Bits* dst = out + p * oh_n * ow_n;
    for (std::int64_t oh = 0; oh < oh_n; ++oh) {
      const Bits* top = src + 2 * oh * g.width;
      rows(top, top + g.width, dst + oh * ow_n, ow_n);
    }
  }
}

template <class Order>
void max_backward_planes(const typename Order::Bits* in, const typename Order::Bits* grad_out,
                         typename Order::Bits* grad_in, const Pool2dGeometry& g, std::int64_t begin,
                         std::int64_t end) {
  using Bits = typename Order::Bits;
  using Key = typename Order::Key;
  const std::int64_t oh_n = g.out_height(), ow_n = g.out_width(), plane = g.height * g.width;
  // Windows that tile the plane without overlap (stride == kernel, the usual maxpool:2).
  const bool disjoint = g.stride == g.kernel_h && g.stride == g.kernel_w;
  // The running maximum's key for a stretch of one output row, and where it came from: the
  // winning tap (i * kernel_w + j) for disjoint windows, the offset in the plane otherwise.
  Key best_key[kStretch];
  std::int64_t best_at[kStretch];
  std::uint32_t best_tap[kStretch];
  for (std::int64_t p = begin; p < end; ++p) {
    const Bits* src = in + p * plane;
    Bits* dst = grad_in + p * plane;
    const Bits* grad = grad_out + p * oh_n * ow_n;
    if (disjoint) {
      // Every element of a window is written exactly once, the gradient or 0, so only what no
      // window covers needs zeroing: the columns right of the last window, the rows below.
      for (std::int64_t h = 0; h < oh_n * g.kernel_h; ++h)
        for (std::int64_t w = ow_n * g.kernel_w; w < g.width; ++w) dst[h * g.width + w] = Bits{};
      for (std::int64_t e = oh_n * g.kernel_h * g.width; e < plane; ++e) dst[e] = Bits{};
      // The winning tap, tap by tap over the outputs (branch-free, vectorised), then each
      // window row written as the gradient where its tap won and 0 elsewhere.
      for (std::int64_t oh = 0; oh < oh_n; ++oh)
        for (std::int64_t ow0 = 0; ow0 < ow_n; ow0 += kStretch) {
          const std::int64_t n = std::min(kStretch, ow_n - ow0);
          const Bits* top = src + oh * g.stride * g.width + ow0 * g.stride;
          const Bits* share = grad + oh * ow_n + ow0;
          for (std::int64_t o = 0; o < n; ++o) {
            best_key[o] = Order::key(top[o * g.stride]);
            best_tap[o] = 0;
          }
          for (std::int64_t i = 0; i < g.kernel_h; ++i)
            for (std::int64_t j = i == 0 ? 1 : 0; j < g.kernel_w; ++j) {
              const Bits* tap = top + i * g.width + j;
              const auto tap_index = static_cast<std::uint32_t>(i * g.kernel_w + j);
              for (std::int64_t o = 0; o < n; ++o) {
                const Key k = Order::key(tap[o * g.stride]);
                const bool take = Order::backward_takes(k, best_key[o]);
                best_key[o] = take ? k : best_key[o];
                best_tap[o] = take ? tap_index : best_tap[o];
              }
            }
          for (std::int64_t i = 0; i < g.kernel_h; ++i) {
            Bits* row = dst + (oh * g.stride + i) * g.width + ow0 * g.stride;
            const auto first_tap = static_cast<std::uint32_t>(i * g.kernel_w);
            if (g.kernel_w == 2) {  // maxpool:2: two stores per window, interleaved by GCC
              for (std::int64_t o = 0; o < n; ++o) {
                row[2 * o] = Order::routed(share[o], best_tap[o], first_tap);
                row[2 * o + 1] = Order::routed(share[o], best_tap[o], first_tap + 1);
              }
              continue;
            }
            for (std::int64_t o = 0; o < n; ++o)
              for (std::int64_t j = 0; j < g.kernel_w; ++j)
                row[o * g.stride + j] =
                    Order::routed(share[o], best_tap[o], first_tap + static_cast<std::uint32_t>(j));
          }
        }
      continue;
    }
    // Windows may overlap (stride < kernel), so the scatter adds: f32 only (the caller checks).
    if constexpr (std::is_same_v<Bits, float>) {
      for (std::int64_t e = 0; e < plane; ++e) dst[e] = 0.f;
      for (std::int64_t oh = 0; oh < oh_n; ++oh)
        for (std::int64_t ow0 = 0; ow0 < ow_n; ow0 += kStretch) {
          const std::int64_t n = std::min(kStretch, ow_n - ow0);
          const std::int64_t corner = oh * g.stride * g.width + ow0 * g.stride;
          for (std::int64_t o = 0; o < n; ++o) {
            best_at[o] = corner + o * g.stride;
            best_key[o] = src[best_at[o]];
          }
          for (std::int64_t i = 0; i < g.kernel_h; ++i)
            for (std::int64_t j = i == 0 ? 1 : 0; j < g.kernel_w; ++j) {
              const std::int64_t tap = corner + i * g.width + j;
              for (std::int64_t o = 0; o < n; ++o) {
                const float v = src[tap + o * g.stride];
                const bool take = Order::backward_takes(v, best_key[o]);
                best_key[o] = take ? v : best_key[o];
                best_at[o] = take ? tap + o * g.stride : best_at[o];
              }
            }
          for (std::int64_t o = 0; o < n; ++o) dst[best_at[o]] += grad[oh * ow_n + ow0 + o];
        }
    }
  }
}

template <class Bits, class Rows>
void max_backward_planes_2x2(const Bits* in, const Bits* grad_out, Bits* grad_in,
                             const Pool2dGeometry& g, std::int64_t begin, std::int64_t end,
                             Rows rows) {
  const std::int64_t oh_n = g.out_height(), ow_n = g.out_width(), plane = g.height * g.width;
  for (std::int64_t p = begin; p < end; ++p) {
    const Bits* src = in + p * plane;
    Bits* dst = grad_in + p * plane;
    const Bits* grad = grad_out + p * oh_n * ow_n;
    if (g.width % 2)  // the last column of an odd width, and an odd height's last row
      for (std::int64_t h = 0; h < 2 * oh_n; ++h) dst[h * g.width + g.width - 1] = Bits{};
    for (std::int64_t e = 2 * oh_n * g.width; e < plane; ++e) dst[e] = Bits{};
    for (std::int64_t oh = 0; oh < oh_n; ++oh) {
      const Bits* top = src + 2 * oh * g.width;
      Bits* dtop = dst + 2 * oh * g.width;
      rows(top, top + g.width, grad + oh * ow_n, dtop, dtop + g.width, ow_n);
    }
  }
}

// The storage dtype every max-pool operand shares: f32, f16 or bf16 on the host.
void require_pool_operand(const char* op, const char* what, const Tensor& t, DType dtype) {
  detail::require(t.defined() && t.device() == Device::cpu && t.dtype() == dtype &&
                      (dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16),
                  op, what, t);
}

}  // namespace

PoolIsa pool_isa() { return std::min(cpu_pool_isa(), pool_isa_limit.load()); }
void limit_pool_isa(PoolIsa limit) { pool_isa_limit.store(limit); }

void max_pool2d_forward(const Tensor& x, const Pool2dGeometry& g, Tensor& y) {
  static const std::string label = "kernels::max_pool2d_forward";
  constexpr const char* op = "kernels::max_pool2d_forward";
  require_pool_operand(op, "input must be f32, f16 or bf16 on the host", x, x.dtype());
  require_pool_operand(op, "output must be on the host in the input's dtype", y, x.dtype());
  const std::int64_t planes = plane_count(op, x, g, y);
  const DType dtype = x.dtype();
  const bool two_by_two = g.kernel_h == 2 && g.kernel_w == 2 && g.stride == 2;
  parallel_rows(label, planes, g.height * g.width, [&](std::int64_t begin, std::int64_t end) {
    if (dtype == DType::f32) {
      // f32's maxpool:2 has an AVX-512 clone only: the portable loop vectorises with AVX2.
      if (two_by_two && pool_isa() == PoolIsa::avx512)
        return max_forward_planes_2x2(x.data<float>(), y.data<float>(), g, begin, end,
                                      max_forward_rows_2x2_f32_avx512);
      return max_forward_planes<F32Order>(x.data<float>(), y.data<float>(), g, begin, end);
    }
    const auto* in = static_cast<const std::uint16_t*>(x.raw());
    auto* out = static_cast<std::uint16_t*>(y.raw());
    if (dtype == DType::bf16)
      return two_by_two
                 ? max_forward_planes_2x2(in, out, g, begin, end, forward_rows_2x2<BF16Order>())
                 : max_forward_planes<BF16Order>(in, out, g, begin, end);
    return two_by_two ? max_forward_planes_2x2(in, out, g, begin, end, forward_rows_2x2<F16Order>())
                      : max_forward_planes<F16Order>(in, out, g, begin, end);
  });
}

void max_pool2d_backward(const Tensor& x, const Pool2dGeometry& g, const Tensor& dy, Tensor& dx) {
  static const std::string label = "kernels::max_pool2d_backward";
  constexpr const char* op = "kernels::max_pool2d_backward";
  require_pool_operand(op, "input must be f32, f16 or bf16 on the host", x, x.dtype());
  require_pool_operand(op, "dy must be on the host in x's dtype", dy, x.dtype());
  const std::int64_t planes = plane_count(op, x, g, dy);
  detail::require_pair(dx.defined() && dx.dtype() == x.dtype() && dx.device() == Device::cpu &&
                           dx.numel() == x.numel(),
                       op, "dx must be on the host shaped like x, in its dtype", x, dx);
  const DType dtype = x.dtype();
  const bool disjoint = g.stride == g.kernel_h && g.stride == g.kernel_w;
  // Overlapping windows add gradients: in f32, so that a sum is rounded once (the layers stage
  // 16-bit storage through f32 for them).
  detail::require(dtype == DType::f32 || disjoint, op,
                  "16-bit max pooling's backward needs disjoint windows (stride == kernel)", x);
  const bool two_by_two = g.kernel_h == 2 && g.kernel_w == 2 && g.stride == 2;
  parallel_rows(label, planes, g.height * g.width, [&](std::int64_t begin, std::int64_t end) {
    if (dtype == DType::f32) {
      if (two_by_two && pool_isa() == PoolIsa::avx512)
        return max_backward_planes_2x2(x.data<float>(), dy.data<float>(), dx.data<float>(), g,
                                       begin, end, max_backward_rows_2x2_f32_avx512);
      return max_backward_planes<F32Order>(x.data<float>(), dy.data<float>(), dx.data<float>(), g,
                                           begin, end);
    }
    const auto* in = static_cast<const std::uint16_t*>(x.raw());
    const auto* grad_out = static_cast<const std::uint16_t*>(dy.raw());
    auto* grad_in = static_cast<std::uint16_t*>(dx.raw());
    if (dtype == DType::bf16)
      return two_by_two ? max_backward_planes_2x2(in, grad_out, grad_in, g, begin, end,
                                                  backward_rows_2x2<BF16Order>())
                        : max_backward_planes<BF16Order>(in, grad_out, grad_in, g, begin, end);
    return two_by_two ? max_backward_planes_2x2(in, grad_out, grad_in, g, begin, end,
                                                backward_rows_2x2<F16Order>())
                      : max_backward_planes<F16Order>(in, grad_out, grad_in, g, begin, end);
  });
}

void avg_pool2d_forward(const Tensor& x, const Pool2dGeometry& g, Tensor& y) {
  static const std::string label = "kernels::avg_pool2d_forward";
  const std::int64_t planes = check_planes("kernels::avg_pool2d_forward", x, g, y);
  const float* in = x.data<float>();
  float* out = y.data<float>();
  const std::int64_t oh_n = g.out_height(), ow_n = g.out_width();
  const float scale = 1.f / static_cast<float>(g.kernel_h * g.kernel_w);
  parallel_rows(label, planes, g.height * g.width, [=](std::int64_t begin, std::int64_t end) {
    for (std::int64_t p = begin; p < end; ++p) {
      const float* src = in + p * g.height * g.width;
      float* dst = out + p * oh_n * ow_n;
      for (std::int64_t oh = 0; oh < oh_n; ++oh)
        for (std::int64_t ow = 0; ow < ow_n; ++ow) {
          const float* window = src + oh * g.stride * g.width + ow * g.stride;
          float sum = 0.f;
          for (std::int64_t i = 0; i < g.kernel_h; ++i)
            for (std::int64_t j = 0; j < g.kernel_w; ++j) sum += window[i * g.width + j];
          dst[oh * ow_n + ow] = sum * scale;
        }
    }
  });
}

void avg_pool2d_backward(const Pool2dGeometry& g, const Tensor& dy, Tensor& dx) {
  static const std::string label = "kernels::avg_pool2d_backward";
  const std::int64_t planes = check_planes("kernels::avg_pool2d_backward", dx, g, dy);
  const float* grad_out = dy.data<float>();
  float* grad_in = dx.data<float>();
  const std::int64_t oh_n = g.out_height(), ow_n = g.out_width(), plane = g.height * g.width;
  const float scale = 1.f / static_cast<float>(g.kernel_h * g.kernel_w);
  parallel_rows(label, planes, plane, [=](std::int64_t begin, std::int64_t end) {
    for (std::int64_t p = begin; p < end; ++p) {
      float* dst = grad_in + p * plane;
      for (std::int64_t e = 0; e < plane; ++e) dst[e] = 0.f;
      for (std::int64_t oh = 0; oh < oh_n; ++oh)
        for (std::int64_t ow = 0; ow < ow_n; ++ow) {
          const float share = grad_out[p * oh_n * ow_n + oh * ow_n + ow] * scale;
          float* window = dst + oh * g.stride * g.width + ow * g.stride;
          for (std::int64_t i = 0; i < g.kernel_h; ++i)
            for (std::int64_t j = 0; j < g.kernel_w; ++j) window[i * g.width + j] += share;
        }
    }
  });
}

}  // namespace mpt::kernels::host
