// kernels/staging.hpp: the checks, the host path (copies at once), and the dispatch to the cuda
// twin's streams for a tensor on the cuda device.
#include "kernels/staging.hpp"

#include <cstring>
#include <string>

#include "core/error.hpp"

namespace mpt::kernels {
namespace {

std::size_t bytes_of(const Tensor& t, std::int64_t elements) {
  return static_cast<std::size_t>(elements) * dtype_size(t.dtype());
}

#ifndef MPTRAIN_HAVE_CUDA
[[noreturn]] void no_cuda() {
  abort_job("kernels::HostStaging: a cuda tensor in a build without CUDA");
}
#endif

}  // namespace

HostStaging::HostStaging(const Tensor& data, int slots) : data_(data), slots_(slots) {
  const DType dtype = data.defined() ? data.dtype() : DType::f32;
  if (!data.defined() || (dtype != DType::f32 && dtype != DType::f16 && dtype != DType::bf16) ||
      slots < 1)
    abort_job("kernels::HostStaging: needs an f32, f16 or bf16 tensor and at least one slot");
  if (data.device() == Device::cpu) {
    host_ = Tensor(data.shape(), dtype);
    return;
  }
#ifdef MPTRAIN_HAVE_CUDA
  host_ = device_memory::pinned_host_tensor(
      data.shape(), dtype,
      "the staged gradients' host twin: a smaller model, or NCCL (--comm.intra=nccl), which "
      "needs none");
  streams_ = cuda::staging_create(slots);
#else
  no_cuda();
#endif
}

HostStaging::~HostStaging() {
#ifdef MPTRAIN_HAVE_CUDA
  if (streams_ != nullptr) cuda::staging_destroy(streams_);  // waits for the queued copies
#endif
}

void HostStaging::check(const char* what, std::int64_t begin, std::int64_t end) const {
  if (begin < 0 || begin > end || end > data_.numel())
    abort_job(std::string("kernels::HostStaging::") + what + ": range [" + std::to_string(begin) +
              ", " + std::to_string(end) + ") outside the " + std::to_string(data_.numel()) +
              " elements");
}

void HostStaging::download(int slot, std::int64_t begin, std::int64_t end) {
  check("download", begin, end);
  if (slot < 0 || slot >= slots_)
    abort_job("kernels::HostStaging::download: slot " + std::to_string(slot) + " of " +
              std::to_string(slots_));
  const std::size_t offset = bytes_of(data_, begin), bytes = bytes_of(data_, end - begin);
  auto* const dst = static_cast<unsigned char*>(host_.raw()) + offset;
  const auto* const src = static_cast<const unsigned char*>(data_.raw()) + offset;
  if (streams_ == nullptr) {
    if (bytes) std::memcpy(dst, src, bytes);
    return;
  }
#ifdef MPTRAIN_HAVE_CUDA
  cuda::staging_download(streams_, slot, dst, src, bytes);
#endif
}

void HostStaging::wait_downloaded(int slot) {
  if (slot < 0 || slot >= slots_)
    abort_job("kernels::HostStaging::wait_downloaded: slot " + std::to_string(slot) + " of " +
              std::to_string(slots_));
#ifdef MPTRAIN_HAVE_CUDA
  if (streams_ != nullptr) cuda::staging_wait(streams_, slot);
#endif
}

void HostStaging::upload(std::int64_t begin, std::int64_t end) {
  check("upload", begin, end);
  const std::size_t offset = bytes_of(data_, begin), bytes = bytes_of(data_, end - begin);
  auto* const dst = static_cast<unsigned char*>(data_.raw()) + offset;
  const auto* const src = static_cast<const unsigned char*>(host_.raw()) + offset;
  if (streams_ == nullptr) {
    if (bytes) std::memcpy(dst, src, bytes);
    return;
  }
#ifdef MPTRAIN_HAVE_CUDA
  cuda::staging_upload(streams_, dst, src, bytes);
#endif
}

void HostStaging::join() {
#ifdef MPTRAIN_HAVE_CUDA
  if (streams_ != nullptr) cuda::staging_join(streams_);
#endif
}

}  // namespace mpt::kernels
