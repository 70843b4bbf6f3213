// Private to nn: a run of samples at a time in f32 for the layers without a blocked 16-bit path
// (conv walks blocks of samples, pooling and GELU one sample). Under f32 storage a run is a plain
// view; under f16/bf16 it is widened into (or rounded back from) a small scratch planned once,
// so the step allocates nothing.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "core/tensor.hpp"
#include "kernels/cast.hpp"

namespace mpt::nn {

class SampleStaging {
 public:
  static constexpr std::size_t kSlots = 4;

  // Samples per staged run for a layer on DEVICE with N elements a sample and batches of up to
  // MAX_BATCH: one on the host (a sample stays in cache); on the cuda device as many as fill
  // 2^20 floats (4 MiB a slot, conv's block size), so that a 16-bit batch costs a few launches
  // rather than a few per sample.
  static std::int64_t run_samples(Device device, std::int64_t n, std::int64_t max_batch) {
    if (device == Device::cpu) return 1;
    const std::int64_t fit = (std::int64_t{1} << 20) / std::max<std::int64_t>(1, n);
    return std::max<std::int64_t>(1, std::min(fit, max_batch));
  }

  // Reserves f32 scratch on DEVICE (the layer's tensors' device) for the given elements per
  // slot; nothing under f32 storage.
  void plan(DType precision, Device device, const std::array<std::int64_t, kSlots>& slot_elements) {
    if (precision == DType::f32) return;
    std::int64_t total = 0;
    for (std::size_t i = 0; i < kSlots; ++i) {
      offsets_[i] = total;
      total += slot_elements[i];
    }
    if (scratch_.numel() < total || scratch_.device() != device)
      scratch_ = Tensor({total}, DType::f32, device);
  }
  std::int64_t scratch_bytes() const {
    return scratch_.defined() ? static_cast<std::int64_t>(scratch_.size_bytes()) : 0;
  }

  // Sample S (N elements each) of SRC as f32 [N]: a view, or widened into SLOT's scratch.
  const Tensor& read(const Tensor& src, std::int64_t s, std::int64_t n, std::size_t slot) {
    Tensor::view_into(sample_[slot], src, s * n, {n});
    if (src.dtype() == DType::f32) return sample_[slot];
    Tensor::view_into(widened_[slot], scratch_, offsets_[slot], {n});
    kernels::cast(sample_[slot], widened_[slot]);
    return widened_[slot];
  }
  // Where to write sample S of DST in f32; call commit(SLOT) after writing it.
  Tensor& write(Tensor& dst, std::int64_t s, std::int64_t n, std::size_t slot) {
    Tensor::view_into(sample_[slot], dst, s * n, {n});
    if (dst.dtype() == DType::f32) return sample_[slot];
    Tensor::view_into(widened_[slot], scratch_, offsets_[slot], {n});
    return widened_[slot];
  }
  // Samples [FIRST, FIRST + COUNT) of SRC (N elements each) as f32 [COUNT, N]; the slot must
  // have been planned for COUNT * N elements.
  const Tensor& read_run(const Tensor& src, std::int64_t first, std::int64_t count, std::int64_t n,
                         std::size_t slot) {
    Tensor::view_into(sample_[slot], src, first * n, {count, n});
    if (src.dtype() == DType::f32) return sample_[slot];
    Tensor::view_into(widened_[slot], scratch_, offsets_[slot], {count, n});
    kernels::cast(sample_[slot], widened_[slot]);
    return widened_[slot];
  }
  // Where to write samples [FIRST, FIRST + COUNT) of DST in f32; then commit(SLOT).
  Tensor& write_run(Tensor& dst, std::int64_t first, std::int64_t count, std::int64_t n,
                    std::size_t slot) {
    Tensor::view_into(sample_[slot], dst, first * n, {count, n});
    if (dst.dtype() == DType::f32) return sample_[slot];
    Tensor::view_into(widened_[slot], scratch_, offsets_[slot], {count, n});
    return widened_[slot];
  }
  // Rounds SLOT's f32 sample into its 16-bit destination (nothing to do under f32).
  void commit(std::size_t slot) {
    if (sample_[slot].dtype() != DType::f32) kernels::cast(widened_[slot], sample_[slot]);
  }

 private:
  Tensor scratch_;
  std::array<std::int64_t, kSlots> offsets_{};
  // Re-pointed per sample; kept so that their shapes are not reallocated.
  std::array<Tensor, kSlots> sample_, widened_;
};

}  // namespace mpt::nn
