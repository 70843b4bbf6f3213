// CUDA graphs of the training step (--cuda.graphs): the kernels a piece of the step launches on
// the compute stream, captured once and then replayed with one launch, so that a
// launch-bound step (small batches: hundreds of kernels of a few microseconds) pays the
// launch cost once. A graph replays exactly what was captured: the same kernels, arguments
// and buffers. So the captured code must launch the same work every step, read every
// per-step value from device memory (the step state, kernels/step_state.hpp), and never
// synchronise with the host (no copy to or from pageable memory, no read-back); the trainer
// copies each batch into fixed buffers before the replay, and refuses layers that break this
// (nn::Layer::graph_blocker).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "core/tensor.hpp"

namespace mpt::kernels {

// True when the compute stream can be captured: a CUDA build whose compute stream is not the
// legacy default stream (MPTRAIN_CUDA_LEGACY_STREAM=1 selects that one, for comparisons).
bool graphs_supported();
// The compute stream as an opaque handle (a cudaStream_t), for a library call that a capture
// must hold and that is made outside kernels/ (sync BN's NCCL sum under --cuda.graphs:
// comm::GradientReducer::capture_on); nullptr in a build without CUDA.
void* capture_stream();

class StepGraph {
 public:
  // NAME labels errors ("forward+backward", "optimizer").
  explicit StepGraph(std::string name);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Runs BODY with the calling thread's launches on the compute stream captured instead of
  // executed (cudaStreamCaptureModeThreadLocal), and instantiates the graph. BODY's kernels
  // do not run: replay() runs them. Aborts naming the graph and the CUDA error when the
  // capture fails (BODY synchronised with the host, or used another stream), and in a build
  // without CUDA.
  void capture(const std::function<void()>& body);
  bool captured() const { return exec_ != nullptr; }
  // Launches the captured work on the compute stream, after the work queued there so far.
  // Aborts if a planned device scratch buffer was replaced since the capture
  // (device_memory::scratch_generation): the graph would use the freed block.
  void replay();

 private:
  std::string name_;
  std::uint64_t scratch_generation_ = 0;  // at the capture
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
};

}  // namespace mpt::kernels
