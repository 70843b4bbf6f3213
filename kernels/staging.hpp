// Gradients staged through host memory for an all-reduce on the host (the MPI backends, when
// the model trains on the cuda device): device_memory::Staging over a tensor on any device.
//   cuda  The host twin is page-locked. download() records an event on the compute stream and
//         queues the copy on a "down" stream that waits for it; wait_downloaded() waits for
//         that copy alone; upload() queues the copy back on an "up" stream; join() makes the
//         compute stream wait for the up stream. The host never waits for the compute stream,
//         so a bucket's copy and all-reduce run while backward computes the next ones.
//   cpu   The host twin is plain memory and every copy happens at once. Nothing needs staging
//         on the host, but the trainer runs the cuda control flow this way where it is asked to
//         (MPTRAIN_STAGE_GRADIENTS=1), so that the CPU tests check it.
#pragma once

#include <cstdint>

#include "core/device_memory.hpp"
#include "core/tensor.hpp"

namespace mpt::kernels {

class HostStaging final : public device_memory::Staging {
 public:
  // DATA: f32, f16 or bf16 on any device, holding its storage (not its values) for as long as
  // this object lives. SLOTS >= 1 downloads can be told apart (the reducer's bucket count).
  HostStaging(const Tensor& data, int slots);
  ~HostStaging() override;
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;

  void* host() override { return host_.raw(); }
  void download(int slot, std::int64_t begin, std::int64_t end) override;
  void wait_downloaded(int slot) override;
  void upload(std::int64_t begin, std::int64_t end) override;
  void join() override;

  const Tensor& host_tensor() const { return host_; }

 private:
  // Aborts naming WHAT unless [BEGIN, END) is a range of the tensor's elements.
  void check(const char* what, std::int64_t begin, std::int64_t end) const;

  Tensor data_;
  Tensor host_;
  int slots_;
  void* streams_ = nullptr;  // the cuda twin's streams and events (kernels/cuda/staging.cu)
};

// The cuda twin's primitives (kernels/cuda/staging.cu; only in a CUDA build). STREAMS is an
// opaque handle: streams "down" and "up", an event per slot and two more.
namespace cuda {
void* staging_create(int slots);
void staging_destroy(void* streams);
void staging_download(void* streams, int slot, void* host_dst, const void* device_src, std::size_t bytes);
void staging_wait(void* streams, int slot);
void staging_upload(void* streams, void* device_dst, const void* host_src, std::size_t bytes);
void staging_join(void* streams);
}  // namespace cuda

}  // namespace mpt::kernels
