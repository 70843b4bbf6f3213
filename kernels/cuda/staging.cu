// The cuda twin of kernels/staging.hpp: two non-blocking copy streams beside the compute stream,
// ordered with events only. A download waits (on the device) for the compute work queued before
// it, an upload goes out as soon as the host is done with its range, and join() puts one event
// wait on the compute stream: no call here waits on the host except wait_downloaded(), for its
// own copy.
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/staging.hpp"

namespace mpt::kernels::cuda {
namespace {

struct Streams {
  int device = 0;                 // current when made; set again on every calling thread
  cudaStream_t down = nullptr;    // device -> host
  cudaStream_t up = nullptr;      // host -> device
  cudaEvent_t written = nullptr;  // the compute stream's point at the last download()
  cudaEvent_t uploaded = nullptr; // the up stream's point at the last join()
  std::vector<cudaEvent_t> landed;  // per slot: its last download's end
};

Streams& of(void* streams) { return *static_cast<Streams*>(streams); }

cudaEvent_t make_event() {
  cudaEvent_t event = nullptr;
  MPT_CHECK_CUDA(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return event;
}

}  // namespace

void* staging_create(int slots) {
  auto* s = new Streams;
  MPT_CHECK_CUDA(cudaGetDevice(&s->device));
  // Non-blocking: the copies must not queue behind the legacy stream's work, nor it behind them.
  MPT_CHECK_CUDA(cudaStreamCreateWithFlags(&s->down, cudaStreamNonBlocking));
  MPT_CHECK_CUDA(cudaStreamCreateWithFlags(&s->up, cudaStreamNonBlocking));
  s->written = make_event();
  s->uploaded = make_event();
  s->landed.resize(static_cast<std::size_t>(slots));
  for (auto& event : s->landed) event = make_event();
  return s;
}

void staging_destroy(void* streams) {
  // Errors are not checked: a destructor, possibly after the runtime shut down.
  Streams* s = &of(streams);
  cudaSetDevice(s->device);
  cudaStreamSynchronize(s->down);
  cudaStreamSynchronize(s->up);
  for (cudaEvent_t event : s->landed) cudaEventDestroy(event);
  cudaEventDestroy(s->written);
  cudaEventDestroy(s->uploaded);
  cudaStreamDestroy(s->down);
  cudaStreamDestroy(s->up);
  delete s;
}

void staging_download(void* streams, int slot, void* host_dst, const void* device_src,
                      std::size_t bytes) {
  Streams& s = of(streams);
  MPT_CHECK_CUDA(cudaSetDevice(s.device));
  // One "written" event serves every download: a stream wait takes the event's state when it
  // is queued, so recording it again later changes nothing for this copy.
  MPT_CHECK_CUDA(cudaEventRecord(s.written, stream()));
  MPT_CHECK_CUDA(cudaStreamWaitEvent(s.down, s.written, 0));
  if (bytes) MPT_CHECK_CUDA(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, s.down));
  MPT_CHECK_CUDA(cudaEventRecord(s.landed[static_cast<std::size_t>(slot)], s.down));
}

void staging_wait(void* streams, int slot) {
  Streams& s = of(streams);
  MPT_CHECK_CUDA(cudaSetDevice(s.device));
  MPT_CHECK_CUDA(cudaEventSynchronize(s.landed[static_cast<std::size_t>(slot)]));
}

void staging_upload(void* streams, void* device_dst, const void* host_src, std::size_t bytes) {
  Streams& s = of(streams);
  MPT_CHECK_CUDA(cudaSetDevice(s.device));
  if (bytes) MPT_CHECK_CUDA(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, s.up));
}

void staging_join(void* streams) {
  Streams& s = of(streams);
  MPT_CHECK_CUDA(cudaSetDevice(s.device));
  MPT_CHECK_CUDA(cudaEventRecord(s.uploaded, s.up));
  // The compute stream (and, through it, every later download) waits for the uploads.
  MPT_CHECK_CUDA(cudaStreamWaitEvent(stream(), s.uploaded, 0));
}

}  // namespace mpt::kernels::cuda
