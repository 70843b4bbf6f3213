// CUDA batch normalisation kernels (see kernels/batchnorm.hpp). The per-channel sums split each
// channel into slices, a thread block each (sum_slices: a function of the shape alone): double
// sums per thread, a fixed shared-memory tree per block, then the slices added in order by one
// thread per channel, so the result depends on neither scheduling nor the GPU (no atomics).
// With one slice the block writes the sums itself. The elementwise passes are one thread per
// element with explicit roundings, so they are the host's f32 arithmetic bit for bit; so are
// the per-channel coefficients (one thread per channel, double intrinsics: no FMA contraction).
#include <algorithm>
#include <initializer_list>

#include "kernels/batchnorm.hpp"
#include "kernels/cuda/common.cuh"

namespace mpt::kernels::cuda {
namespace {

void check_batch(const char* op, const char* what, const Tensor& t, std::int64_t channels) {
  detail::require(t.defined() && t.device() == Device::cuda && is_float_dtype(t.dtype()) &&
                      t.rank() >= 1 && channels > 0 && t.numel() % channels == 0,
                  op, what, t);
}
void check_channels(const char* op, const char* what, const Tensor& t, std::int64_t channels) {
  detail::require(
      t.defined() && t.device() == Device::cuda && t.dtype() == DType::f32 && t.numel() >= channels,
      op, what, t);
}
// SUMS holds 2C values, and the sample count after them when WITH_COUNT.
void check_sums(const char* op, const Tensor& sums, std::int64_t channels, bool with_count) {
  detail::require(sums.defined() && sums.device() == Device::cuda && sums.dtype() == DType::f32 &&
                      sums.numel() >= 2 * channels + (with_count ? 1 : 0),
                  op,
                  with_count ? "sums must be f32 with at least 2C + 1 elements on the cuda device"
                             : "sums must be f32 with at least 2C elements on the cuda device",
                  sums);
}
void check_same(const char* op, const Tensor& a, const Tensor& b) {
  detail::require_pair(a.numel() == b.numel(), op, "tensors must have the same element count", a,
                       b);
}

// The batch seen as N planes per channel, as on the host: planes = N*C, plane = S.
struct Layout {
  std::int64_t batch, planes, plane;
};
Layout layout(const Tensor& x, std::int64_t channels) {
  const std::int64_t batch = x.dim(0);
  return {batch, batch * channels, batch == 0 ? 0 : x.numel() / (batch * channels)};
}

// Float storage as the device lambdas and kernels read and write it: f32, or 16-bit (f16 or
// bf16) widened and rounded as the host converters do.
struct Storage {
  void* data;
  bool is_16, is_f16;
};
Storage storage(const Tensor& t) {
  return {const_cast<void*>(t.raw()), t.dtype() != DType::f32, t.dtype() == DType::f16};
}
__device__ inline float load(const Storage& s, std::int64_t i) {
  return s.is_16 ? widen16(static_cast<const std::uint16_t*>(s.data)[i], s.is_f16)
                 : static_cast<const float*>(s.data)[i];
}
__device__ inline void store(const Storage& s, std::int64_t i, float value) {
  if (s.is_16)
    static_cast<std::uint16_t*>(s.data)[i] = round16(value, s.is_f16);
  else
    static_cast<float*>(s.data)[i] = value;
}

// Channels beyond the grid limit are covered by striding.
constexpr std::int64_t kMaxChannelBlocks = 65535;

// Block-wide sum of two doubles per thread into FIRST[0] and SECOND[0], tree in a fixed order.
__device__ inline void block_sum_pair(double* first, double* second) {
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) {
      first[threadIdx.x] += first[threadIdx.x + half];
      second[threadIdx.x] += second[threadIdx.x + half];
    }
    __syncthreads();
  }
}

// The slices of a channel's N*S elements: enough blocks to fill a GPU where the channels are
// few (resnet-mini's 16-64 would otherwise keep at most 64 SMs busy), each of at least
// kSliceElements elements, channels * slices pairs of partial sums at most (the scratch).
constexpr std::int64_t kSliceElements = 4096;
constexpr std::int64_t kMaxSlices = 64;
constexpr std::int64_t kMaxSlicePairs = 4096;

int sum_slices(std::int64_t channels, std::int64_t count) {
  if (channels > kMaxSlicePairs) return 1;
  const std::int64_t slices =
      std::min({count / kSliceElements, kMaxSlices, kMaxSlicePairs / channels});
  return static_cast<int>(std::max<std::int64_t>(slices, 1));
}

// Two doubles per (channel, slice), from the arena on first use (the first eager step, before
// any graph capture) and never replaced; its users run on stream(), each writing its pairs
// before the finishing kernel reads them.
double* slice_scratch() {
  static double* const scratch = static_cast<double*>(
      device_memory::allocate_cuda(static_cast<std::size_t>(kMaxSlicePairs) * 2 * sizeof(double)));
  return scratch;
}

// Channel C's totals FIRST and SECOND into SUMS[c] and SUMS[C + c], SECOND times SCALE[c] in
// double where SCALE is given (the backward sums' invstd), each rounded to f32 once.
__device__ inline void store_sums(double first, double second, std::int64_t c,
                                  std::int64_t channels, const float* scale, float* sums) {
  sums[c] = static_cast<float>(first);
  sums[channels + c] = static_cast<float>(scale ? second * scale[c] : second);
}

// Thread 0's block totals FIRST and SECOND of channel C: with one slice the sums themselves
// (store_sums), else the slice's pair for finish_slices_kernel.
__device__ inline void write_slice(double first, double second, std::int64_t c,
                                   std::int64_t channels, int slices, const float* scale,
                                   double* partials, float* sums) {
  if (slices == 1) return store_sums(first, second, c, channels, scale, sums);
  double* pair = partials + 2 * (c * slices + blockIdx.y);
  pair[0] = first;
  pair[1] = second;
}

// SUMS[c] = sum of x, SUMS[C + c] = sum of x^2 over channel c's N planes of PLANE elements, and
// SUMS[2C] = N. Each square is taken in double: exact for f32 inputs, so only the additions round.
__global__ void sums_kernel(Storage x, std::int64_t channels, std::int64_t batch,
                            std::int64_t plane, int slices, double* partials, float* sums) {
  __shared__ double sum[kThreads], squares[kThreads];
  const SliceRange range = slice_range(batch * plane, slices);
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0)
    sums[2 * channels] = static_cast<float>(batch);
  for (std::int64_t c = blockIdx.x; c < channels; c += gridDim.x) {
    double s = 0, q = 0;
    for_channel_slice(c, channels, plane, range.begin, range.end, [&](std::int64_t i) {
      const double v = load(x, i);
      s += v;
      q += v * v;
    });
    sum[threadIdx.x] = s;
    squares[threadIdx.x] = q;
    block_sum_pair(sum, squares);
    if (threadIdx.x == 0)
      write_slice(sum[0], squares[0], c, channels, slices, nullptr, partials, sums);
    __syncthreads();  // sum[0] is read before the next channel overwrites it
  }
}

// SUMS[c] = sum of dy, SUMS[C + c] = INVSTD[c] * sum of dy * (x - MEAN[c]). Each term in double
// (the host takes it in f32, then sums in double), the sum times invstd in double, rounded once.
__global__ void backward_sums_kernel(Storage x, Storage dy, std::int64_t channels,
                                     std::int64_t batch, std::int64_t plane, const float* mean,
                                     const float* invstd, int slices, double* partials,
                                     float* sums) {
  __shared__ double sum[kThreads], centred[kThreads];
  const SliceRange range = slice_range(batch * plane, slices);
  for (std::int64_t c = blockIdx.x; c < channels; c += gridDim.x) {
    const double centre = mean[c];
    double s = 0, t = 0;
    for_channel_slice(c, channels, plane, range.begin, range.end, [&](std::int64_t i) {
      const double g = load(dy, i);
      s += g;
      t += g * (load(x, i) - centre);
    });
    sum[threadIdx.x] = s;
    centred[threadIdx.x] = t;
    block_sum_pair(sum, centred);
    if (threadIdx.x == 0)
      write_slice(sum[0], centred[0], c, channels, slices, invstd, partials, sums);
    __syncthreads();
  }
}

// One thread per channel adds its SLICES pairs in slice order, then stores as one slice would.
__global__ void finish_slices_kernel(const double* partials, std::int64_t channels, int slices,
                                     const float* scale, float* sums) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= channels) return;
  double first = 0, second = 0;
  for (int k = 0; k < slices; ++k) {
    first += partials[2 * (c * slices + k)];
    second += partials[2 * (c * slices + k) + 1];
  }
  store_sums(first, second, c, channels, scale, sums);
}

// The sums' grid: a block per (channel, slice), channels beyond the grid limit by striding
// (those have one slice); then the slices' finishing pass where there are several.
struct SumsLaunch {
  dim3 grid;
  int slices;
  double* partials;
};
SumsLaunch sums_launch(std::int64_t channels, std::int64_t count) {
  const int slices = sum_slices(channels, count);
  const auto channel_blocks = static_cast<unsigned>(std::min(channels, kMaxChannelBlocks));
  return {dim3(channel_blocks, static_cast<unsigned>(slices)), slices,
          slice_scratch()};  // taken on the first call, whatever the slicing
}
void finish_slices(const char* op, const SumsLaunch& launch, std::int64_t channels,
                   const float* scale, float* sums) {
  if (launch.slices == 1) return;
  const auto blocks = static_cast<unsigned>((channels + kThreads - 1) / kThreads);
  finish_slices_kernel<<<blocks, kThreads, 0, stream()>>>(launch.partials, channels,
                                                          launch.slices, scale, sums);
  check_launch(op);
}

// std::max(0.0, x) as the host evaluates it: 0 unless 0 < x, so a NaN gives 0 too.
__device__ inline double at_least_zero(double x) { return 0.0 < x ? x : 0.0; }

}  // namespace

void batchnorm_sums(const Tensor& x, std::int64_t channels, Tensor& sums) {
  constexpr const char* op = "kernels::cuda::batchnorm_sums";
  check_batch(op, "x must be [N, C, ...] f32, f16 or bf16 on the cuda device", x, channels);
  check_sums(op, sums, channels, /*with_count=*/true);
  const Layout l = layout(x, channels);
  const SumsLaunch launch = sums_launch(channels, l.batch * l.plane);
  sums_kernel<<<launch.grid, kThreads, 0, stream()>>>(storage(x), channels, l.batch, l.plane,
                                                      launch.slices, launch.partials,
                                                      sums.data<float>());
  check_launch(op);
  finish_slices(op, launch, channels, nullptr, sums.data<float>());
}

void batchnorm_apply(const Tensor& x, std::int64_t channels, const Tensor& scale,
                     const Tensor& shift, Tensor& y) {
  constexpr const char* op = "kernels::cuda::batchnorm_apply";
  check_batch(op, "x must be [N, C, ...] f32, f16 or bf16 on the cuda device", x, channels);
  check_batch(op, "y must be f32, f16 or bf16 on the cuda device", y, channels);
  check_same(op, x, y);
  check_channels(op, "scale must be f32 [C] on the cuda device", scale, channels);
  check_channels(op, "shift must be f32 [C] on the cuda device", shift, channels);
  const Layout l = layout(x, channels);
  const Storage in = storage(x), out = storage(y);  // may alias: each thread reads, then writes
  const float* a = scale.data<float>();
  const float* b = shift.data<float>();
  // x * k + d rounded twice, as the host (nvcc would contract it into one FMA).
  launch_channel_elementwise(op, l.planes * l.plane, l.plane, channels,
                             [=] __device__(std::int64_t i, std::int64_t c) {
                               store(out, i, __fadd_rn(__fmul_rn(load(in, i), a[c]), b[c]));
                             });
}

void batchnorm_backward_sums(const Tensor& x, const Tensor& dy, std::int64_t channels,
                             const Tensor& mean, const Tensor& invstd, Tensor& sums) {
  constexpr const char* op = "kernels::cuda::batchnorm_backward_sums";
  check_batch(op, "x must be [N, C, ...] f32, f16 or bf16 on the cuda device", x, channels);
  check_batch(op, "dy must be f32, f16 or bf16 on the cuda device", dy, channels);
  check_same(op, x, dy);
  check_channels(op, "mean must be f32 [C] on the cuda device", mean, channels);
  check_channels(op, "invstd must be f32 [C] on the cuda device", invstd, channels);
  check_sums(op, sums, channels, /*with_count=*/false);
  const Layout l = layout(x, channels);
  const SumsLaunch launch = sums_launch(channels, l.batch * l.plane);
  backward_sums_kernel<<<launch.grid, kThreads, 0, stream()>>>(
      storage(x), storage(dy), channels, l.batch, l.plane, mean.data<float>(), invstd.data<float>(),
      launch.slices, launch.partials, sums.data<float>());
  check_launch(op);
  finish_slices(op, launch, channels, invstd.data<float>(), sums.data<float>());
}

void batchnorm_backward_dx(const Tensor& x, const Tensor& dy, std::int64_t channels,
                           const Tensor& mean, const Tensor& dy_coef, const Tensor& x_coef,
                           const Tensor& bias, Tensor& dx) {
  constexpr const char* op = "kernels::cuda::batchnorm_backward_dx";
  check_batch(op, "x must be [N, C, ...] f32, f16 or bf16 on the cuda device", x, channels);
  check_batch(op, "dy must be f32, f16 or bf16 on the cuda device", dy, channels);
  check_batch(op, "dx must be f32, f16 or bf16 on the cuda device", dx, channels);
  check_same(op, x, dy);
  check_same(op, dy, dx);
  for (const Tensor* t : {&mean, &dy_coef, &x_coef, &bias})
    check_channels(op, "per-channel coefficients must be f32 [C] on the cuda device", *t, channels);
  const Layout l = layout(x, channels);
  const Storage in = storage(x), grad_out = storage(dy), grad_in = storage(dx);  // dx may alias dy
  const float* m = mean.data<float>();
  const float* k1 = dy_coef.data<float>();
  const float* k2 = x_coef.data<float>();
  const float* k3 = bias.data<float>();
  // (k1 * dy + k2 * (x - mean)) + k3, every operation rounded as on the host (no FMA).
  launch_channel_elementwise(
      op, l.planes * l.plane, l.plane, channels, [=] __device__(std::int64_t i, std::int64_t c) {
        const float g = load(grad_out, i), v = load(in, i);
        const float value =
            __fadd_rn(__fadd_rn(__fmul_rn(k1[c], g), __fmul_rn(k2[c], __fsub_rn(v, m[c]))), k3[c]);
        store(grad_in, i, value);
      });
}

void batchnorm_forward_coefs(const Tensor& sums, double plane, bool training, const Tensor& gamma,
                             const Tensor& beta, Tensor& running_mean, Tensor& running_var,
                             double momentum, double epsilon, Tensor& mean, Tensor& invstd,
                             Tensor& scale, Tensor& shift) {
  constexpr const char* op = "kernels::cuda::batchnorm_forward_coefs";
  const std::int64_t channels = gamma.numel();
  check_channels(op, "gamma must be f32 on the cuda device", gamma, channels);
  const std::initializer_list<const Tensor*> per_channel = {
      &beta, &running_mean, &running_var, &mean, &invstd, &scale, &shift};
  for (const Tensor* t : per_channel)
    check_channels(op, "per-channel values must be f32 [C] on the cuda device", *t, channels);
  if (training) check_sums(op, sums, channels, /*with_count=*/true);  // evaluation reads no sums
  const float* sum = training ? sums.data<float>() : nullptr;
  const float* g = gamma.data<float>();
  const float* b = beta.data<float>();
  float* rm = running_mean.data<float>();
  float* rv = running_var.data<float>();
  float* mu = mean.data<float>();
  float* is = invstd.data<float>();
  float* sc = scale.data<float>();
  float* sh = shift.data<float>();
  const double keep = 1 - momentum;
  // Every double operation in the host's order and grouping, each rounded on its own. The count
  // (samples, summed over ranks under sync BN, times the plane) is device data: every thread
  // derives it, and the unbiasing factor, as the host twin does once.
  launch_elementwise(op, channels, [=] __device__(std::int64_t k) {
    const double count = training ? __dmul_rn(static_cast<double>(sum[2 * channels]), plane) : 0.0;
    float mean_k, invstd_k;
    if (count > 0) {  // training on at least one sample
      const double unbias = count > 1 ? __ddiv_rn(count, __dsub_rn(count, 1.0)) : 1.0;
      const double m = __ddiv_rn(sum[k], count);
      const double var =
          at_least_zero(__dsub_rn(__ddiv_rn(sum[channels + k], count), __dmul_rn(m, m)));
      mean_k = __double2float_rn(m);
      invstd_k = __double2float_rn(__ddiv_rn(1.0, __dsqrt_rn(__dadd_rn(var, epsilon))));
      // (1 - momentum) * running + momentum * m, and momentum * var * unbias left to right.
      rm[k] = __double2float_rn(__dadd_rn(__dmul_rn(keep, rm[k]), __dmul_rn(momentum, m)));
      rv[k] = __double2float_rn(
          __dadd_rn(__dmul_rn(keep, rv[k]), __dmul_rn(__dmul_rn(momentum, var), unbias)));
    } else {
      mean_k = rm[k];
      invstd_k = __double2float_rn(__ddiv_rn(1.0, __dsqrt_rn(__dadd_rn(rv[k], epsilon))));
    }
    mu[k] = mean_k;
    is[k] = invstd_k;
    // s = gamma * invstd (the f32 one), shift = beta - (mean * s).
    const double s = __dmul_rn(g[k], invstd_k);
    sc[k] = __double2float_rn(s);
    sh[k] = __double2float_rn(__dsub_rn(b[k], __dmul_rn(mean_k, s)));
  });
}

void batchnorm_backward_coefs(const Tensor& sums, double plane, const Tensor& gamma,
                              const Tensor& invstd, Tensor& dy_coef, Tensor& x_coef, Tensor& bias) {
  constexpr const char* op = "kernels::cuda::batchnorm_backward_coefs";
  const std::int64_t channels = gamma.numel();
  check_channels(op, "gamma must be f32 on the cuda device", gamma, channels);
  const std::initializer_list<const Tensor*> per_channel = {&invstd, &dy_coef, &x_coef, &bias};
  for (const Tensor* t : per_channel)
    check_channels(op, "per-channel values must be f32 [C] on the cuda device", *t, channels);
  check_sums(op, sums, channels, /*with_count=*/plane > 0);
  const float* sum = sums.data<float>();
  const float* g = gamma.data<float>();
  const float* is = invstd.data<float>();
  float* k1 = dy_coef.data<float>();
  float* k2 = x_coef.data<float>();
  float* k3 = bias.data<float>();
  // g = gamma * invstd; x_coef = ((-g * invstd) * sum dy xhat) / count, bias = (-g * sum dy) /
  // count: each operation rounded on its own, as the host.
  launch_elementwise(op, channels, [=] __device__(std::int64_t k) {
    const double count =
        plane > 0 ? __dmul_rn(static_cast<double>(sum[2 * channels]), plane) : 0.0;
    const bool through_stats = count > 0;
    const double gk = __dmul_rn(g[k], is[k]);
    k1[k] = __double2float_rn(gk);
    k2[k] = through_stats ? __double2float_rn(__ddiv_rn(
                                __dmul_rn(__dmul_rn(-gk, is[k]), sum[channels + k]), count))
                          : 0.f;
    k3[k] = through_stats ? __double2float_rn(__ddiv_rn(__dmul_rn(-gk, sum[k]), count)) : 0.f;
  });
}

}  // namespace mpt::kernels::cuda
