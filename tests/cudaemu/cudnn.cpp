// The CUDA emulator's cuDNN: the legacy-API calls that kernels/cuda/conv2d_cudnn.cu,
// pool2d_cudnn.cu and cudnn_runtime.cu make, checked as the library checks them and computed on
// the host (products summed in double, rounded to f32, scaled, rounded once to the output's
// type; the output is not read when beta is 0). What it checks is the project's use of cuDNN:
//   - descriptors: set before use, not used after destroy, shapes that agree with each other
//     and with the output dimensions cuDNN computes, one data type across x, w and y, and the
//     compute types cuDNN accepts for it;
//   - the algorithm heuristics (cudnnGet*_v7): a fixed ranking per shape and type, with the
//     entries the project must pass over (non-deterministic algorithms, tensor-op entries that
//     mean TF32 for f32 data, transform algorithms, unsupported shapes) ranked first where cuDNN
//     ranks them so; each algorithm has its own workspace size;
//   - execution: the algorithm's workspace given at full size, in device memory, and written
//     over before any input is read (so a workspace that overlaps live data corrupts it, as on a
//     GPU); every tensor inside device memory of the handle's device; no output over an input;
//     f32 data under any math type but CUDNN_FMA_MATH computed from TF32-rounded inputs, as
//     Ampere and later GPUs do, so that a plan that lets TF32 in misses f32's tolerances;
//   - the handle's stream: work runs on it (stream order and capture as the emulator's
//     runtime models them), and a stream of another device is refused.
// Algorithms differ here only in their workspace: the rounding, speed and tie-breaking of
// cuDNN's kernels are the GPU check's (perf/gpu_check.sh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "tests/cudaemu/emulator.hpp"

struct cudnnContext {
  int device = 0;
  cudaStream_t stream = nullptr;
};
struct cudnnTensorStruct {
  bool set = false;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int n = 0, c = 0, h = 0, w = 0;
  int ns = 0, cs = 0, hs = 0, ws = 0;  // strides, in elements
};
struct cudnnFilterStruct {
  bool set = false;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int k = 0, c = 0, h = 0, w = 0;
};
struct cudnnConvolutionStruct {
  bool set = false;
  int pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1;
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};
struct cudnnPoolingStruct {
  bool set = false;
  cudnnPoolingMode_t mode = CUDNN_POOLING_MAX;
  cudnnNanPropagation_t nan = CUDNN_NOT_PROPAGATE_NAN;
  int window_h = 0, window_w = 0, pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1;
};

namespace {

using mpt::cudaemu::device_memory_owner;

[[noreturn]] void fault(const std::string& message) {
  std::fprintf(stderr, "cudaemu: cuDNN %s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}

// The objects alive now: a destroyed or made-up descriptor is refused, not read.
struct Live {
  std::mutex mutex;
  std::set<const void*> objects;
};
Live& live() {
  static Live* const instance = new Live;
  return *instance;
}
template <class T>
cudnnStatus_t create(T** out) {
  if (out == nullptr) return CUDNN_STATUS_BAD_PARAM;
  *out = new T;
  const std::lock_guard<std::mutex> lock(live().mutex);
  live().objects.insert(*out);
  return CUDNN_STATUS_SUCCESS;
}
template <class T>
cudnnStatus_t destroy(T* object) {
  if (object == nullptr) return CUDNN_STATUS_SUCCESS;
  {
    const std::lock_guard<std::mutex> lock(live().mutex);
    if (live().objects.erase(object) == 0) return CUDNN_STATUS_BAD_PARAM;
  }
  delete object;
  return CUDNN_STATUS_SUCCESS;
}
bool alive(const void* object) {
  const std::lock_guard<std::mutex> lock(live().mutex);
  return object != nullptr && live().objects.count(object) != 0;
}
template <class T>
bool usable(const T* object) {
  return alive(object) && object->set;
}

std::size_t element_bytes(cudnnDataType_t type) {
  return type == CUDNN_DATA_FLOAT                                   ? 4
         : (type == CUDNN_DATA_HALF || type == CUDNN_DATA_BFLOAT16) ? 2
                                                                    : 0;
}
bool sixteen_bit(cudnnDataType_t type) { return element_bytes(type) == 2; }

float load(const void* base, std::int64_t index, cudnnDataType_t type) {
  if (type == CUDNN_DATA_FLOAT) return static_cast<const float*>(base)[index];
  std::uint16_t bits;
  std::memcpy(&bits, static_cast<const char*>(base) + index * 2, 2);
  return type == CUDNN_DATA_HALF ? __half2float(__ushort_as_half(bits))
                                 : __bfloat162float(__ushort_as_bfloat16(bits));
}
void store(void* base, std::int64_t index, cudnnDataType_t type, float value) {
  if (type == CUDNN_DATA_FLOAT) {
    static_cast<float*>(base)[index] = value;
    return;
  }
  const std::uint16_t bits = type == CUDNN_DATA_HALF
                                 ? __half_as_ushort(__float2half_rn(value))
                                 : __bfloat16_as_ushort(__float2bfloat16_rn(value));
  std::memcpy(static_cast<char*>(base) + index * 2, &bits, 2);
}
// TF32: f32 with 10 explicit significand bits, rounded to nearest even (Inf and NaN kept).
float tf32(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7f800000u) == 0x7f800000u) return value;
  bits += 0xfffu + ((bits >> 13) & 1u);
  bits &= ~0x1fffu;
  std::memcpy(&value, &bits, 4);
  return value;
}

// A tensor's values as f32, in NCHW order, read through its strides.
struct Dims {
  int n, c, h, w;
};
Dims dims(const cudnnTensorStruct& t) { return {t.n, t.c, t.h, t.w}; }
Dims dims(const cudnnFilterStruct& f) { return {f.k, f.c, f.h, f.w}; }
std::int64_t count(const Dims& d) { return std::int64_t{d.n} * d.c * d.h * d.w; }
std::int64_t at(const cudnnTensorStruct& t, int n, int c, int h, int w) {
  return std::int64_t{n} * t.ns + std::int64_t{c} * t.cs + std::int64_t{h} * t.hs +
         std::int64_t{w} * t.ws;
}
// The bytes from a tensor's first element to its last, inclusive.
std::size_t extent(const cudnnTensorStruct& t) {
  return static_cast<std::size_t>(at(t, t.n - 1, t.c - 1, t.h - 1, t.w - 1) + 1) *
         element_bytes(t.type);
}
// A filter is a packed NCHW tensor (KCRS): read, written and measured as one.
cudnnTensorStruct as_tensor(const cudnnFilterStruct& f) {
  cudnnTensorStruct t;
  t.set = f.set;
  t.type = f.type;
  t.n = f.k, t.c = f.c, t.h = f.h, t.w = f.w;
  t.ws = 1, t.hs = f.w, t.cs = f.h * f.w, t.ns = f.c * f.h * f.w;
  return t;
}
std::size_t extent(const cudnnFilterStruct& f) { return extent(as_tensor(f)); }
std::vector<float> read(const cudnnTensorStruct& t, const void* data, bool round_tf32) {
  std::vector<float> out(static_cast<std::size_t>(count(dims(t))));
  std::size_t i = 0;
  for (int n = 0; n < t.n; ++n)
    for (int c = 0; c < t.c; ++c)
      for (int h = 0; h < t.h; ++h)
        for (int w = 0; w < t.w; ++w) {
          const float v = load(data, at(t, n, c, h, w), t.type);
          out[i++] = round_tf32 ? tf32(v) : v;
        }
  return out;
}
std::vector<float> read(const cudnnFilterStruct& f, const void* data, bool round_tf32) {
  return read(as_tensor(f), data, round_tf32);
}
// Y = alpha * RESULT + beta * Y (Y not read when beta is 0), element by element in NCHW order.
void write(const cudnnTensorStruct& t, void* data, const std::vector<double>& result, float alpha,
           float beta) {
  std::size_t i = 0;
  for (int n = 0; n < t.n; ++n)
    for (int c = 0; c < t.c; ++c)
      for (int h = 0; h < t.h; ++h)
        for (int w = 0; w < t.w; ++w) {
          const std::int64_t index = at(t, n, c, h, w);
          float value = alpha * static_cast<float>(result[i++]);
          if (beta != 0.f) value += beta * load(data, index, t.type);
          store(data, index, t.type, value);
        }
}
void write(const cudnnFilterStruct& f, void* data, const std::vector<double>& result, float alpha,
           float beta) {
  write(as_tensor(f), data, result, alpha, beta);
}

// ---- checks shared by the calls -------------------------------------------------------------

// A tensor argument of CALL: inside device memory of the handle's device, element-aligned.
struct Region {
  const char* name;
  const void* data;
  std::size_t bytes;
  std::size_t element;
};
// A region of no bytes (a workspace the algorithm does not use) is not checked.
void check_regions(const char* call, const cudnnContext& handle, std::vector<Region> inputs,
                   const std::vector<Region>& outputs) {
  inputs.erase(
      std::remove_if(inputs.begin(), inputs.end(), [](const Region& r) { return r.bytes == 0; }),
      inputs.end());
  const auto check = [&](const Region& r) {
    if (r.data == nullptr) fault(std::string(call) + ": " + r.name + " is null");
    if (reinterpret_cast<std::uintptr_t>(r.data) % r.element != 0)
      fault(std::string(call) + ": " + r.name + " is not aligned to its element size");
    const int owner = device_memory_owner(r.data, r.bytes);
    if (owner < 0)
      fault(std::string(call) + ": " + r.name + " (" + std::to_string(r.bytes) +
            " bytes) is not inside one device allocation");
    if (owner != handle.device)
      fault(std::string(call) + ": " + r.name + " is memory of device " + std::to_string(owner) +
            ", but the handle belongs to device " + std::to_string(handle.device));
  };
  const auto overlap = [](const Region& a, const Region& b) {
    const auto* pa = static_cast<const char*>(a.data);
    const auto* pb = static_cast<const char*>(b.data);
    return pa < pb + b.bytes && pb < pa + a.bytes;
  };
  for (const Region& r : inputs) check(r);
  for (const Region& r : outputs) {
    check(r);
    // cuDNN computes out of place: an output over an input gives undefined results.
    for (const Region& in : inputs)
      if (overlap(r, in))
        fault(std::string(call) + ": " + r.name + " overlaps " + in.name +
              " (cuDNN works out of place)");
  }
}

// The scaling factors: float for f32, f16 and bf16 data.
bool scaling(const void* alpha, const void* beta, float& a, float& b) {
  if (alpha == nullptr || beta == nullptr) return false;
  a = *static_cast<const float*>(alpha);
  b = *static_cast<const float*>(beta);
  return true;
}

// ---- convolution: shapes, heuristics, workspace ---------------------------------------------

struct ConvProblem {
  cudnnTensorStruct x, y;
  cudnnFilterStruct w;
  cudnnConvolutionStruct conv;
};

int out_dim(int in, int pad, int window, int dilation, int stride) {
  return 1 + (in + 2 * pad - ((window - 1) * dilation + 1)) / stride;
}

// The convolution as cuDNN checks it: descriptors set, one data type, a compute type cuDNN
// takes for it (FLOAT for f32; FLOAT, the pseudo-16-bit configurations, for f16 and bf16), the
// channels agreeing, and Y shaped as cudnnGetConvolution2dForwardOutputDim says.
cudnnStatus_t conv_problem(const cudnnTensorStruct* x, const cudnnFilterStruct* w,
                           const cudnnConvolutionStruct* conv, const cudnnTensorStruct* y,
                           ConvProblem& p) {
  if (!usable(x) || !usable(w) || !usable(conv) || !usable(y)) return CUDNN_STATUS_BAD_PARAM;
  if (x->type != w->type || x->type != y->type) return CUDNN_STATUS_BAD_PARAM;
  if (conv->compute != CUDNN_DATA_FLOAT) {
    // TRUE_HALF (f16 accumulation) is not something mptrain asks for.
    mpt::cudaemu::emulator_limit("cuDNN convolution with a compute type other than FLOAT");
  }
  if (x->c != w->c || y->n != x->n || y->c != w->k) return CUDNN_STATUS_BAD_PARAM;
  if (y->h != out_dim(x->h, conv->pad_h, w->h, conv->dilation_h, conv->stride_h) ||
      y->w != out_dim(x->w, conv->pad_w, w->w, conv->dilation_w, conv->stride_w))
    return CUDNN_STATUS_BAD_PARAM;
  p = {*x, *y, *w, *conv};
  return CUDNN_STATUS_SUCCESS;
}

enum class Direction { forward, backward_data, backward_filter };

// One entry of a heuristic's ranking.
struct Ranked {
  int algo;
  cudnnMathType_t math;
  bool deterministic;
};

bool is_3x3_unit_stride(const ConvProblem& p) {
  return p.w.h == 3 && p.w.w == 3 && p.conv.stride_h == 1 && p.conv.stride_w == 1 &&
         p.conv.dilation_h == 1 && p.conv.dilation_w == 1;
}
bool unit_stride(const ConvProblem& p) {
  return p.conv.stride_h == 1 && p.conv.stride_w == 1 && p.conv.dilation_h == 1 &&
         p.conv.dilation_w == 1;
}

// The heuristic's ranking, best first. The tensor-op entries are the algorithms cuDNN runs on
// tensor cores (its legacy-API guide: IMPLICIT_PRECOMP_GEMM and WINOGRAD_NONFUSED forward,
// ALGO_1 and WINOGRAD_NONFUSED backward); for f32 data they mean TF32. Backward ALGO_0 and
// filter ALGO_3 add with atomics (non-deterministic), as cuDNN documents.
std::vector<Ranked> ranking(Direction direction, const ConvProblem& p) {
  const bool f32 = p.x.type == CUDNN_DATA_FLOAT;
  const cudnnMathType_t tc = CUDNN_TENSOR_OP_MATH, plain = CUDNN_DEFAULT_MATH;
  switch (direction) {
    case Direction::forward:
      return {{CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED, tc, true},
              {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, tc, true},
              {CUDNN_CONVOLUTION_FWD_ALGO_FFT, plain, true},
              {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, plain, true},
              {CUDNN_CONVOLUTION_FWD_ALGO_GEMM, plain, true},
              {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, plain, true}};
    case Direction::backward_data:
      return {{CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, plain, false},
              {CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED, tc, true},
              {CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, tc, true},
              {CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING, plain, true},
              {CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, plain, true}};
    case Direction::backward_filter:
      return {{CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, plain, false},
              {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, tc, true},
              {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3, plain, false},
              {f32 ? CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT : CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1,
               plain, true},
              {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, plain, true}};
  }
  return {};
}

// Whether ALGO computes the problem (cuDNN's own limits, simplified to the ones that matter
// here: the transforms want unit strides, Winograd 3x3 windows), and its workspace in bytes.
bool workspace_of(Direction direction, int algo, const ConvProblem& p, std::size_t& bytes) {
  const std::size_t e = element_bytes(p.x.type);
  const std::size_t window = std::size_t(p.w.c) * p.w.h * p.w.w;
  const std::size_t positions = std::size_t(p.y.h) * p.y.w;
  const std::size_t filter = std::size_t(p.w.k) * window * e;
  const std::size_t plane_pairs = std::size_t(p.x.n) * (p.x.c + p.w.k) *
                                  std::size_t(p.x.h + 2 * p.conv.pad_h) *
                                  std::size_t(p.x.w + 2 * p.conv.pad_w) * 8;  // complex f32
  bytes = 0;
  switch (direction) {
    case Direction::forward:
      switch (algo) {
        case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM:
          return true;
        case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM:
          bytes = window * 2 * sizeof(int);  // the precomputed offsets
          return true;
        case CUDNN_CONVOLUTION_FWD_ALGO_GEMM:
          bytes = window * positions * e;  // one sample's im2col
          return true;
        case CUDNN_CONVOLUTION_FWD_ALGO_FFT:
          bytes = plane_pairs;
          return unit_stride(p);
        case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED:
          bytes = filter * 4 + std::size_t(p.x.n) * p.x.c * positions * 4 * e;
          return is_3x3_unit_stride(p);
        default:
          return false;
      }
    case Direction::backward_data:
      switch (algo) {
        case CUDNN_CONVOLUTION_BWD_DATA_ALGO_0:
          return true;
        case CUDNN_CONVOLUTION_BWD_DATA_ALGO_1:
          bytes = filter;  // the rotated filter
          return true;
        case CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING:
          bytes = plane_pairs;
          return unit_stride(p);
        case CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED:
          bytes = filter * 4 + std::size_t(p.x.n) * p.w.k * positions * 4 * e;
          return is_3x3_unit_stride(p);
        default:
          return false;
      }
    case Direction::backward_filter:
      switch (algo) {
        case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0:
        case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3:
          return true;
        case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1:
          bytes = window * positions * e + filter;  // one sample's im2col, f32 partial sums
          return true;
        case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT:
          bytes = plane_pairs;
          return unit_stride(p);
        default:
          return false;
      }
  }
  return false;
}

template <class Perf, class Algo>
cudnnStatus_t heuristic(Direction direction, const ConvProblem& p, int requested, int* returned,
                        Perf* results) {
  if (returned == nullptr || results == nullptr || requested < 1) return CUDNN_STATUS_BAD_PARAM;
  const std::vector<Ranked> ranked = ranking(direction, p);
  const int n = std::min<int>(requested, static_cast<int>(ranked.size()));
  for (int i = 0; i < n; ++i) {
    const Ranked& r = ranked[static_cast<std::size_t>(i)];
    Perf perf{};
    perf.algo = static_cast<Algo>(r.algo);
    std::size_t bytes = 0;
    perf.status = workspace_of(direction, r.algo, p, bytes) ? CUDNN_STATUS_SUCCESS
                                                            : CUDNN_STATUS_NOT_SUPPORTED;
    perf.time = -1.f;  // heuristics do not time
    perf.memory = bytes;
    perf.determinism = r.deterministic ? CUDNN_DETERMINISTIC : CUDNN_NON_DETERMINISTIC;
    perf.mathType = r.math;
    results[i] = perf;
  }
  *returned = n;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t workspace_query(Direction direction, const ConvProblem& p, int algo, size_t* size) {
  if (size == nullptr) return CUDNN_STATUS_BAD_PARAM;
  std::size_t bytes = 0;
  if (!workspace_of(direction, algo, p, bytes)) return CUDNN_STATUS_NOT_SUPPORTED;
  *size = bytes;
  return CUDNN_STATUS_SUCCESS;
}

// TF32 where cuDNN would use it: f32 data under any math type but FMA.
bool uses_tf32(const ConvProblem& p) {
  return p.x.type == CUDNN_DATA_FLOAT && p.conv.math != CUDNN_FMA_MATH;
}

// The algorithm's use of its workspace: written over in full before any input is read.
void scribble(void* workspace, std::size_t bytes) {
  if (bytes > 0) std::memset(workspace, 0xa5, bytes);
}

// Window offset (kernel flipped for CUDNN_CONVOLUTION, as cuDNN's mode says).
int tap(const cudnnConvolutionStruct& conv, int r, int size) {
  return conv.mode == CUDNN_CONVOLUTION ? size - 1 - r : r;
}

// The emulated convolutions sum in double over NCHW-ordered f32 values (x, w, dy read through
// their descriptors): y[n,k,i,j] = sum over c, r, t of x[n,c,i*s-pad+r*d, j*s-pad+t*d] w[k,c,r',t']
// (r' = r, or the flipped tap under CUDNN_CONVOLUTION). Each product of two floats is exact in
// double, and every output sums its products in one fixed order: forward over (c, r, t), the
// data gradient over (k, r, t), the filter gradient over (n, i, j). The loops keep the
// channel they sum into innermost and contiguous (channels-last copies), so the compiler
// vectorises them: the emulator's time is mostly here and in cublaslt.cpp's matmul.
struct Geometry {
  int n, c, h, w;      // x
  int k, r, t;         // w's output channels and window
  int yh, yw;          // y's plane
  const cudnnConvolutionStruct* conv;

  explicit Geometry(const ConvProblem& p)
      : n(p.x.n), c(p.x.c), h(p.x.h), w(p.x.w), k(p.w.k), r(p.w.h), t(p.w.w), yh(p.y.h),
        yw(p.y.w), conv(&p.conv) {}
  // x's row and column under output (i, j) and tap (r, t); -1 where it falls in the padding.
  int row(int i, int rr) const {
    const int at = i * conv->stride_h - conv->pad_h + rr * conv->dilation_h;
    return at >= 0 && at < h ? at : -1;
  }
  int col(int j, int tt) const {
    const int at = j * conv->stride_w - conv->pad_w + tt * conv->dilation_w;
    return at >= 0 && at < w ? at : -1;
  }
  // w's NCHW index of output channel KK, input channel CC at loop tap (RR, TT).
  std::size_t filter(int kk, int cc, int rr, int tt) const {
    return static_cast<std::size_t>(
        ((std::int64_t{kk} * c + cc) * r + tap(*conv, rr, r)) * t + tap(*conv, tt, t));
  }
};

// [a][x][y] -> [a][y][x]: channels last with (x, y) = (channels, plane), and back with
// (plane, channels).
template <class T>
std::vector<T> swap_inner(const std::vector<T>& v, std::int64_t a, std::int64_t x, std::int64_t y) {
  std::vector<T> out(v.size());
  for (std::int64_t i = 0; i < a; ++i)
    for (std::int64_t j = 0; j < x; ++j)
      for (std::int64_t q = 0; q < y; ++q) out[(i * y + q) * x + j] = v[(i * x + j) * y + q];
  return out;
}

// The filter by loop tap, the channel summed into innermost: [c][r][t][k] for the forward
// sums (OUTPUT_INNER), [k][r][t][c] for the data gradient's.
std::vector<float> filter_by_tap(const Geometry& g, const std::vector<float>& ws,
                                 bool output_inner) {
  std::vector<float> wt(ws.size());
  for (int kk = 0; kk < g.k; ++kk)
    for (int cc = 0; cc < g.c; ++cc)
      for (int rr = 0; rr < g.r; ++rr)
        for (int tt = 0; tt < g.t; ++tt) {
          const std::size_t tap_at = (output_inner ? std::size_t(cc) * g.r : std::size_t(kk) * g.r) + rr;
          const std::size_t at = output_inner ? (tap_at * g.t + tt) * g.k + kk
                                              : (tap_at * g.t + tt) * g.c + cc;
          wt[at] = ws[g.filter(kk, cc, rr, tt)];
        }
  return wt;
}

// y (NCHW, in double) from x and w.
std::vector<double> forward_sums(const Geometry& g, const std::vector<float>& xs,
                                 const std::vector<float>& ws) {
  const std::vector<float> wt = filter_by_tap(g, ws, /*output_inner=*/true);
  const std::int64_t plane = std::int64_t{g.yh} * g.yw;
  std::vector<double> sums(static_cast<std::size_t>(g.n * plane * g.k), 0.0);  // [n][i][j][k]
  for (int nn = 0; nn < g.n; ++nn)
    for (int i = 0; i < g.yh; ++i)
      for (int j = 0; j < g.yw; ++j) {
        double* out = &sums[static_cast<std::size_t>(((nn * plane) + i * g.yw + j) * g.k)];
        for (int cc = 0; cc < g.c; ++cc)
          for (int rr = 0; rr < g.r; ++rr) {
            const int row = g.row(i, rr);
            if (row < 0) continue;
            for (int tt = 0; tt < g.t; ++tt) {
              const int col = g.col(j, tt);
              if (col < 0) continue;
              const double xv = xs[((std::size_t(nn) * g.c + cc) * g.h + row) * g.w + col];
              const float* wk = &wt[((std::size_t(cc) * g.r + rr) * g.t + tt) * g.k];
              for (int kk = 0; kk < g.k; ++kk) out[kk] += xv * wk[kk];
            }
          }
      }
  return swap_inner(sums, g.n, plane, g.k);
}

// dx (NCHW, in double) from dy and w.
std::vector<double> data_gradient_sums(const Geometry& g, const std::vector<float>& ys,
                                       const std::vector<float>& ws) {
  const std::vector<float> wt = filter_by_tap(g, ws, /*output_inner=*/false);
  const std::int64_t plane = std::int64_t{g.h} * g.w;
  std::vector<double> sums(static_cast<std::size_t>(g.n * plane * g.c), 0.0);  // [n][h][w][c]
  for (int nn = 0; nn < g.n; ++nn)
    for (int kk = 0; kk < g.k; ++kk)
      for (int rr = 0; rr < g.r; ++rr)
        for (int tt = 0; tt < g.t; ++tt) {
          const float* wc = &wt[((std::size_t(kk) * g.r + rr) * g.t + tt) * g.c];
          for (int i = 0; i < g.yh; ++i) {
            const int row = g.row(i, rr);
            if (row < 0) continue;
            for (int j = 0; j < g.yw; ++j) {
              const int col = g.col(j, tt);
              if (col < 0) continue;
              const double dy = ys[((std::size_t(nn) * g.k + kk) * g.yh + i) * g.yw + j];
              double* out = &sums[static_cast<std::size_t>((nn * plane + row * g.w + col) * g.c)];
              for (int cc = 0; cc < g.c; ++cc) out[cc] += dy * wc[cc];
            }
          }
        }
  return swap_inner(sums, g.n, plane, g.c);
}

// dw (NCHW, in double) from x and dy.
std::vector<double> filter_gradient_sums(const Geometry& g, const std::vector<float>& xs,
                                         const std::vector<float>& ys) {
  const std::int64_t plane = std::int64_t{g.yh} * g.yw;
  const std::vector<float> dyt = swap_inner(ys, g.n, g.k, plane);  // [n][i][j][k]
  std::vector<double> sums(static_cast<std::size_t>(g.k) * g.c * g.r * g.t, 0.0);
  std::vector<double> acc(static_cast<std::size_t>(g.k));
  for (int cc = 0; cc < g.c; ++cc)
    for (int rr = 0; rr < g.r; ++rr)
      for (int tt = 0; tt < g.t; ++tt) {
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int nn = 0; nn < g.n; ++nn)
          for (int i = 0; i < g.yh; ++i) {
            const int row = g.row(i, rr);
            if (row < 0) continue;
            for (int j = 0; j < g.yw; ++j) {
              const int col = g.col(j, tt);
              if (col < 0) continue;
              const double xv = xs[((std::size_t(nn) * g.c + cc) * g.h + row) * g.w + col];
              const float* dy = &dyt[static_cast<std::size_t>((nn * plane + i * g.yw + j) * g.k)];
              for (int kk = 0; kk < g.k; ++kk) acc[kk] += xv * dy[kk];
            }
          }
        for (int kk = 0; kk < g.k; ++kk) sums[g.filter(kk, cc, rr, tt)] = acc[kk];
      }
  return sums;
}

// A tensor argument as a call names it.
struct Named {
  const char* name;
  const void* data;
};

// The three convolution calls: STATUS is conv_problem's for P; A and B are the inputs (x and w
// forward, dy and w for the data gradient, x and dy for the filter's), OUT the output. Checked,
// then queued on the handle's stream: the workspace written over, the inputs read (TF32 where
// the math type lets cuDNN use it), the products summed in double.
cudnnStatus_t convolve(const char* call, cudnnHandle_t handle, const void* alpha, const void* beta,
                       cudnnStatus_t status, const ConvProblem& p, Direction direction, int algo,
                       void* workspace, std::size_t workspace_bytes, Named a, Named b, Named out) {
  float alpha_value = 0, beta_value = 0;
  if (!alive(handle) || !scaling(alpha, beta, alpha_value, beta_value))
    return CUDNN_STATUS_BAD_PARAM;
  if (status != CUDNN_STATUS_SUCCESS) return status;
  std::size_t required = 0;
  if (!workspace_of(direction, algo, p, required)) return CUDNN_STATUS_NOT_SUPPORTED;
  if (workspace_bytes < required) return CUDNN_STATUS_BAD_PARAM;
  const std::size_t e = element_bytes(p.x.type);
  const std::size_t x_bytes = extent(p.x), w_bytes = extent(p.w), y_bytes = extent(p.y);
  const auto bytes_of = [&](Direction d, int slot) {  // slot 0, 1: the inputs; 2: the output
    const std::size_t order[3][3] = {
        {x_bytes, w_bytes, y_bytes}, {y_bytes, w_bytes, x_bytes}, {x_bytes, y_bytes, w_bytes}};
    return order[static_cast<int>(d)][slot];
  };
  check_regions(call, *handle,
                {{a.name, a.data, bytes_of(direction, 0), e},
                 {b.name, b.data, bytes_of(direction, 1), e},
                 {"the workspace", workspace, required, 1}},
                {{out.name, out.data, bytes_of(direction, 2), e}});
  const cudaError_t queued = mpt::cudaemu::run_on_stream(handle->stream, [=] {
    scribble(workspace, required);
    // Two of x, w and y in, the third out.
    const bool round = uses_tf32(p);
    const auto in = [&](bool used, const cudnnTensorStruct& t, const void* data) {
      return used ? read(t, data, round) : std::vector<float>{};
    };
    const bool forward = direction == Direction::forward;
    const bool data_grad = direction == Direction::backward_data;
    const std::vector<float> xs = in(!data_grad, p.x, a.data);
    const std::vector<float> ws =
        direction == Direction::backward_filter ? std::vector<float>{} : read(p.w, b.data, round);
    const std::vector<float> ys = in(!forward, p.y, data_grad ? a.data : b.data);
    void* result = const_cast<void*>(out.data);
    const Geometry g(p);
    if (forward) {
      write(p.y, result, forward_sums(g, xs, ws), alpha_value, beta_value);
    } else if (data_grad) {
      write(p.x, result, data_gradient_sums(g, ys, ws), alpha_value, beta_value);
    } else {
      write(p.w, result, filter_gradient_sums(g, xs, ys), alpha_value, beta_value);
    }
  });
  return queued == cudaSuccess ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_EXECUTION_FAILED;
}

// ---- pooling --------------------------------------------------------------------------------

struct PoolProblem {
  cudnnPoolingStruct pool;
  cudnnTensorStruct x, y;
};

cudnnStatus_t pool_problem(const cudnnPoolingStruct* pool, const cudnnTensorStruct* x,
                           const cudnnTensorStruct* y, PoolProblem& p) {
  if (!usable(pool) || !usable(x) || !usable(y)) return CUDNN_STATUS_BAD_PARAM;
  if (x->type != y->type || x->n != y->n || x->c != y->c) return CUDNN_STATUS_BAD_PARAM;
  if (y->h != out_dim(x->h, pool->pad_h, pool->window_h, 1, pool->stride_h) ||
      y->w != out_dim(x->w, pool->pad_w, pool->window_w, 1, pool->stride_w))
    return CUDNN_STATUS_BAD_PARAM;
  p = {*pool, *x, *y};
  return CUDNN_STATUS_SUCCESS;
}

bool is_max(cudnnPoolingMode_t mode) {
  return mode == CUDNN_POOLING_MAX || mode == CUDNN_POOLING_MAX_DETERMINISTIC;
}

// For each output element, its window's input indices (NCHW order, clipped to the input) and
// the count the average divides by.
template <class Body>
void for_each_window(const PoolProblem& p, Body body) {
  const cudnnPoolingStruct& pool = p.pool;
  std::vector<std::int64_t> window;
  std::int64_t out = 0;
  for (int n = 0; n < p.x.n; ++n)
    for (int c = 0; c < p.x.c; ++c)
      for (int i = 0; i < p.y.h; ++i)
        for (int j = 0; j < p.y.w; ++j, ++out) {
          window.clear();
          const int top = i * pool.stride_h - pool.pad_h, left = j * pool.stride_w - pool.pad_w;
          for (int r = top; r < top + pool.window_h; ++r)
            for (int t = left; t < left + pool.window_w; ++t)
              if (r >= 0 && r < p.x.h && t >= 0 && t < p.x.w)
                window.push_back(((std::int64_t{n} * p.x.c + c) * p.x.h + r) * p.x.w + t);
          const std::int64_t divisor = pool.mode == CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                                           ? std::int64_t{pool.window_h} * pool.window_w
                                           : static_cast<std::int64_t>(window.size());
          body(out, window, divisor);
        }
}

// The window's maximum's index: the first largest value; under CUDNN_PROPAGATE_NAN the first
// NaN. (Which of equal maxima cuDNN picks is undocumented: the GPU check reports it.)
std::int64_t argmax(const std::vector<float>& x, const std::vector<std::int64_t>& window,
                    cudnnNanPropagation_t nan) {
  std::int64_t best = window.front();
  for (std::int64_t i : window) {
    if (std::isnan(x[i])) {
      if (nan == CUDNN_PROPAGATE_NAN) return i;
      continue;
    }
    if (std::isnan(x[best]) || x[i] > x[best]) best = i;
  }
  return best;
}

}  // namespace

extern "C" {

const char* cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS:
      return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_BAD_PARAM:
      return "CUDNN_STATUS_BAD_PARAM (emulator)";
    case CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH:
      return "CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH (emulator)";
    case CUDNN_STATUS_NOT_SUPPORTED:
      return "CUDNN_STATUS_NOT_SUPPORTED (emulator)";
    case CUDNN_STATUS_EXECUTION_FAILED:
      return "CUDNN_STATUS_EXECUTION_FAILED (emulator)";
    default:
      return "CUDNN_STATUS_UNKNOWN (emulator)";
  }
}

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  const cudnnStatus_t status = create(handle);
  if (status == CUDNN_STATUS_SUCCESS) (*handle)->device = mpt::cudaemu::current_device_index();
  return status;
}

// A stream of another device than the handle's is refused, as cuDNN refuses it.
cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  if (!alive(handle)) return CUDNN_STATUS_BAD_PARAM;
  if (mpt::cudaemu::stream_device(stream) != handle->device)
    return CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH;
  handle->stream = stream;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* desc) { return create(desc); }
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t desc) { return destroy(desc); }
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t desc, cudnnTensorFormat_t format,
                                         cudnnDataType_t type, int n, int c, int h, int w) {
  if (!alive(desc) || n < 1 || c < 1 || h < 1 || w < 1) return CUDNN_STATUS_BAD_PARAM;
  if (format != CUDNN_TENSOR_NCHW) mpt::cudaemu::emulator_limit("cuDNN tensors other than NCHW");
  if (element_bytes(type) == 0) return CUDNN_STATUS_NOT_SUPPORTED;
  *desc = {true, type, n, c, h, w, c * h * w, h * w, w, 1};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* desc) { return create(desc); }
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t desc) { return destroy(desc); }
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t desc, cudnnDataType_t type,
                                         cudnnTensorFormat_t format, int k, int c, int h, int w) {
  if (!alive(desc) || k < 1 || c < 1 || h < 1 || w < 1) return CUDNN_STATUS_BAD_PARAM;
  if (format != CUDNN_TENSOR_NCHW) mpt::cudaemu::emulator_limit("cuDNN filters other than NCHW");
  if (element_bytes(type) == 0) return CUDNN_STATUS_NOT_SUPPORTED;
  *desc = {true, type, k, c, h, w};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* desc) {
  return create(desc);
}
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t desc) {
  return destroy(desc);
}
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t desc, int pad_h,
                                              int pad_w, int u, int v, int dilation_h,
                                              int dilation_w, cudnnConvolutionMode_t mode,
                                              cudnnDataType_t compute) {
  if (!alive(desc) || pad_h < 0 || pad_w < 0 || u < 1 || v < 1 || dilation_h < 1 ||
      dilation_w < 1 || (mode != CUDNN_CONVOLUTION && mode != CUDNN_CROSS_CORRELATION))
    return CUDNN_STATUS_BAD_PARAM;
  const cudnnMathType_t math = desc->math;  // cudnnSetConvolutionMathType's, kept
  *desc = {true, pad_h, pad_w, u, v, dilation_h, dilation_w, mode, compute, math};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t desc, cudnnMathType_t math) {
  if (!alive(desc)) return CUDNN_STATUS_BAD_PARAM;
  if (math != CUDNN_DEFAULT_MATH && math != CUDNN_TENSOR_OP_MATH &&
      math != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION && math != CUDNN_FMA_MATH)
    return CUDNN_STATUS_BAD_PARAM;
  desc->math = math;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(const cudnnConvolutionDescriptor_t conv,
                                                    const cudnnTensorDescriptor_t x,
                                                    const cudnnFilterDescriptor_t w, int* n, int* c,
                                                    int* h, int* wo) {
  if (!usable(conv) || !usable(x) || !usable(w) || !n || !c || !h || !wo)
    return CUDNN_STATUS_BAD_PARAM;
  if (x->c != w->c) return CUDNN_STATUS_BAD_PARAM;
  const int oh = out_dim(x->h, conv->pad_h, w->h, conv->dilation_h, conv->stride_h);
  const int ow = out_dim(x->w, conv->pad_w, w->w, conv->dilation_w, conv->stride_w);
  if (oh < 1 || ow < 1) return CUDNN_STATUS_BAD_PARAM;
  *n = x->n;
  *c = w->k;
  *h = oh;
  *wo = ow;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionForwardAlgorithmMaxCount(cudnnHandle_t handle, int* count) {
  if (!alive(handle) || count == nullptr) return CUDNN_STATUS_BAD_PARAM;
  *count = CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithmMaxCount(cudnnHandle_t handle, int* count) {
  if (!alive(handle) || count == nullptr) return CUDNN_STATUS_BAD_PARAM;
  *count = CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(cudnnHandle_t handle, int* count) {
  if (!alive(handle) || count == nullptr) return CUDNN_STATUS_BAD_PARAM;
  *count = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t x, const cudnnFilterDescriptor_t w,
    const cudnnConvolutionDescriptor_t conv, const cudnnTensorDescriptor_t y, const int requested,
    int* returned, cudnnConvolutionFwdAlgoPerf_t* results) {
  ConvProblem p;
  if (!alive(handle)) return CUDNN_STATUS_BAD_PARAM;
  if (const cudnnStatus_t s = conv_problem(x, w, conv, y, p); s != CUDNN_STATUS_SUCCESS) return s;
  return heuristic<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(
      Direction::forward, p, requested, returned, results);
}
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t w, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t conv, const cudnnTensorDescriptor_t dx, const int requested,
    int* returned, cudnnConvolutionBwdDataAlgoPerf_t* results) {
  ConvProblem p;
  if (!alive(handle)) return CUDNN_STATUS_BAD_PARAM;
  if (const cudnnStatus_t s = conv_problem(dx, w, conv, dy, p); s != CUDNN_STATUS_SUCCESS) return s;
  return heuristic<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t>(
      Direction::backward_data, p, requested, returned, results);
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t x, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t conv, const cudnnFilterDescriptor_t dw, const int requested,
    int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* results) {
  ConvProblem p;
  if (!alive(handle)) return CUDNN_STATUS_BAD_PARAM;
  if (const cudnnStatus_t s = conv_problem(x, dw, conv, dy, p); s != CUDNN_STATUS_SUCCESS) return s;
  return heuristic<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t>(
      Direction::backward_filter, p, requested, returned, results);
}

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t x, const cudnnFilterDescriptor_t w,
    const cudnnConvolutionDescriptor_t conv, const cudnnTensorDescriptor_t y,
    cudnnConvolutionFwdAlgo_t algo, size_t* size) {
  ConvProblem p;
  if (!alive(handle)) return CUDNN_STATUS_BAD_PARAM;
  if (const cudnnStatus_t s = conv_problem(x, w, conv, y, p); s != CUDNN_STATUS_SUCCESS) return s;
  return workspace_query(Direction::forward, p, algo, size);
}
cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t w, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t conv, const cudnnTensorDescriptor_t dx,
    cudnnConvolutionBwdDataAlgo_t algo, size_t* size) {
  ConvProblem p;
  if (!alive(handle)) return CUDNN_STATUS_BAD_PARAM;
  if (const cudnnStatus_t s = conv_problem(dx, w, conv, dy, p); s != CUDNN_STATUS_SUCCESS) return s;
  return workspace_query(Direction::backward_data, p, algo, size);
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t x, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t conv, const cudnnFilterDescriptor_t dw,
    cudnnConvolutionBwdFilterAlgo_t algo, size_t* size) {
  ConvProblem p;
  if (!alive(handle)) return CUDNN_STATUS_BAD_PARAM;
  if (const cudnnStatus_t s = conv_problem(x, dw, conv, dy, p); s != CUDNN_STATUS_SUCCESS) return s;
  return workspace_query(Direction::backward_filter, p, algo, size);
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void* alpha,
                                      const cudnnTensorDescriptor_t x_desc, const void* x,
                                      const cudnnFilterDescriptor_t w_desc, const void* w,
                                      const cudnnConvolutionDescriptor_t conv,
                                      cudnnConvolutionFwdAlgo_t algo, void* workspace,
                                      size_t workspace_bytes, const void* beta,
                                      const cudnnTensorDescriptor_t y_desc, void* y) {
  ConvProblem p;
  const cudnnStatus_t status = conv_problem(x_desc, w_desc, conv, y_desc, p);
  return convolve("cudnnConvolutionForward", handle, alpha, beta, status, p, Direction::forward,
                  algo, workspace, workspace_bytes, {"x", x}, {"w", w}, {"y", y});
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void* alpha,
                                           const cudnnFilterDescriptor_t w_desc, const void* w,
                                           const cudnnTensorDescriptor_t dy_desc, const void* dy,
                                           const cudnnConvolutionDescriptor_t conv,
                                           cudnnConvolutionBwdDataAlgo_t algo, void* workspace,
                                           size_t workspace_bytes, const void* beta,
                                           const cudnnTensorDescriptor_t dx_desc, void* dx) {
  ConvProblem p;
  const cudnnStatus_t status = conv_problem(dx_desc, w_desc, conv, dy_desc, p);
  return convolve("cudnnConvolutionBackwardData", handle, alpha, beta, status, p,
                  Direction::backward_data, algo, workspace, workspace_bytes, {"dy", dy}, {"w", w},
                  {"dx", dx});
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void* alpha,
                                             const cudnnTensorDescriptor_t x_desc, const void* x,
                                             const cudnnTensorDescriptor_t dy_desc, const void* dy,
                                             const cudnnConvolutionDescriptor_t conv,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void* workspace,
                                             size_t workspace_bytes, const void* beta,
                                             const cudnnFilterDescriptor_t dw_desc, void* dw) {
  ConvProblem p;
  const cudnnStatus_t status = conv_problem(x_desc, dw_desc, conv, dy_desc, p);
  return convolve("cudnnConvolutionBackwardFilter", handle, alpha, beta, status, p,
                  Direction::backward_filter, algo, workspace, workspace_bytes, {"x", x},
                  {"dy", dy}, {"dw", dw});
}

cudnnStatus_t cudnnCreatePoolingDescriptor(cudnnPoolingDescriptor_t* desc) { return create(desc); }
cudnnStatus_t cudnnDestroyPoolingDescriptor(cudnnPoolingDescriptor_t desc) { return destroy(desc); }
cudnnStatus_t cudnnSetPooling2dDescriptor(cudnnPoolingDescriptor_t desc, cudnnPoolingMode_t mode,
                                          cudnnNanPropagation_t nan, int window_h, int window_w,
                                          int pad_h, int pad_w, int stride_h, int stride_w) {
  if (!alive(desc) || window_h < 1 || window_w < 1 || pad_h < 0 || pad_w < 0 || stride_h < 1 ||
      stride_w < 1 || pad_h >= window_h || pad_w >= window_w)
    return CUDNN_STATUS_BAD_PARAM;
  if (!is_max(mode) && mode != CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING &&
      mode != CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING)
    return CUDNN_STATUS_BAD_PARAM;
  *desc = {true, mode, nan, window_h, window_w, pad_h, pad_w, stride_h, stride_w};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetPooling2dForwardOutputDim(const cudnnPoolingDescriptor_t pool,
                                                const cudnnTensorDescriptor_t x, int* n, int* c,
                                                int* h, int* w) {
  if (!usable(pool) || !usable(x) || !n || !c || !h || !w) return CUDNN_STATUS_BAD_PARAM;
  const int oh = out_dim(x->h, pool->pad_h, pool->window_h, 1, pool->stride_h);
  const int ow = out_dim(x->w, pool->pad_w, pool->window_w, 1, pool->stride_w);
  if (oh < 1 || ow < 1) return CUDNN_STATUS_BAD_PARAM;
  *n = x->n;
  *c = x->c;
  *h = oh;
  *w = ow;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnPoolingForward(cudnnHandle_t handle, const cudnnPoolingDescriptor_t pool,
                                  const void* alpha, const cudnnTensorDescriptor_t x_desc,
                                  const void* x, const void* beta,
                                  const cudnnTensorDescriptor_t y_desc, void* y) {
  PoolProblem p;
  float a = 0, b = 0;
  if (!alive(handle) || !scaling(alpha, beta, a, b)) return CUDNN_STATUS_BAD_PARAM;
  if (const cudnnStatus_t s = pool_problem(pool, x_desc, y_desc, p); s != CUDNN_STATUS_SUCCESS)
    return s;
  const std::size_t e = element_bytes(p.x.type);
  check_regions("cudnnPoolingForward", *handle, {{"x", x, extent(p.x), e}},
                {{"y", y, extent(p.y), e}});
  const cudaError_t status = mpt::cudaemu::run_on_stream(handle->stream, [=] {
    const std::vector<float> xs = read(p.x, x, false);
    std::vector<double> out(static_cast<std::size_t>(count(dims(p.y))));
    for_each_window(
        p, [&](std::int64_t o, const std::vector<std::int64_t>& window, std::int64_t divisor) {
          if (is_max(p.pool.mode)) {
            out[o] = xs[argmax(xs, window, p.pool.nan)];
          } else {
            double sum = 0;
            for (std::int64_t i : window) sum += xs[i];
            out[o] = static_cast<float>(sum / static_cast<double>(divisor));
          }
        });
    write(p.y, y, out, a, b);
  });
  return status == cudaSuccess ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_EXECUTION_FAILED;
}

cudnnStatus_t cudnnPoolingBackward(cudnnHandle_t handle, const cudnnPoolingDescriptor_t pool,
                                   const void* alpha, const cudnnTensorDescriptor_t y_desc,
                                   const void* y, const cudnnTensorDescriptor_t dy_desc,
                                   const void* dy, const cudnnTensorDescriptor_t x_desc,
                                   const void* x, const void* beta,
                                   const cudnnTensorDescriptor_t dx_desc, void* dx) {
  PoolProblem p;
  float a = 0, b = 0;
  if (!alive(handle) || !scaling(alpha, beta, a, b)) return CUDNN_STATUS_BAD_PARAM;
  if (const cudnnStatus_t s = pool_problem(pool, x_desc, y_desc, p); s != CUDNN_STATUS_SUCCESS)
    return s;
  if (!usable(dy_desc) || !usable(dx_desc)) return CUDNN_STATUS_BAD_PARAM;
  const auto same = [](const cudnnTensorStruct& s, const cudnnTensorStruct& t) {
    return s.type == t.type && s.n == t.n && s.c == t.c && s.h == t.h && s.w == t.w;
  };
  if (!same(*dy_desc, p.y) || !same(*dx_desc, p.x)) return CUDNN_STATUS_BAD_PARAM;
  const cudnnTensorStruct dy_t = *dy_desc, dx_t = *dx_desc;
  const std::size_t e = element_bytes(p.x.type);
  check_regions("cudnnPoolingBackward", *handle,
                {{"y", y, extent(p.y), e}, {"dy", dy, extent(dy_t), e}, {"x", x, extent(p.x), e}},
                {{"dx", dx, extent(dx_t), e}});
  const cudaError_t status = mpt::cudaemu::run_on_stream(handle->stream, [=] {
    const std::vector<float> xs = read(p.x, x, false), dys = read(dy_t, dy, false);
    std::vector<double> out(static_cast<std::size_t>(count(dims(p.x))), 0.0);
    for_each_window(
        p, [&](std::int64_t o, const std::vector<std::int64_t>& window, std::int64_t divisor) {
          if (is_max(p.pool.mode)) {
            out[argmax(xs, window, p.pool.nan)] += dys[o];
          } else {
            for (std::int64_t i : window) out[i] += dys[o] / static_cast<double>(divisor);
          }
        });
    write(dx_t, dx, out, a, b);
  });
  return status == cudaSuccess ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_EXECUTION_FAILED;
}

}  // extern "C"
