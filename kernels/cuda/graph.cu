// CUDA graphs of the compute stream (see kernels/graph.hpp): stream capture into a graph,
// instantiated once, replayed with one cudaGraphLaunch per step.
#include <string>
#include <utility>

#include "core/device_memory.hpp"
#include "core/error.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/graph.hpp"

namespace mpt::kernels {
namespace {

// Destroys what GRAPH and EXEC hold and nulls them. Errors are ignored (a destructor may run
// after the runtime shut down), and cleared, so that the next check_launch does not report them.
void destroy(void*& graph, void*& exec) {
  bool failed = false;
  if (exec != nullptr)
    failed = cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec)) != cudaSuccess || failed;
  if (graph != nullptr)
    failed = cudaGraphDestroy(static_cast<cudaGraph_t>(graph)) != cudaSuccess || failed;
  if (failed) cudaGetLastError();
  graph = nullptr;
  exec = nullptr;
}

[[noreturn]] void capture_failed(const std::string& name, const char* call, cudaError_t status) {
  abort_job("cuda graph '" + name + "': capture failed: " + call + ": " +
            cuda::cuda_error_text(status) +
            " (hint: a layer synchronised with the host, allocated device memory, or used another "
            "stream or the legacy default stream while the step was captured; run without "
            "--cuda.graphs)");
}

}  // namespace

bool graphs_supported() { return !cuda::legacy_stream_selected(); }

void* capture_stream() { return cuda::stream(); }

StepGraph::StepGraph(std::string name) : name_(std::move(name)) {}

StepGraph::~StepGraph() { destroy(graph_, exec_); }

void StepGraph::capture(const std::function<void()>& body) {
  if (!graphs_supported())
    abort_job("cuda graph '" + name_ +
              "': cannot capture: MPTRAIN_CUDA_LEGACY_STREAM=1 put the kernels on the legacy "
              "default stream, which CUDA graphs cannot capture (hint: unset "
              "MPTRAIN_CUDA_LEGACY_STREAM, or run without --cuda.graphs)");
  destroy(graph_, exec_);  // a second capture replaces the first
  // A call that fails inside the capture is often not the culprit: say what was going on.
  const FailureContext context("capturing CUDA graph '" + name_ +
                               "': a synchronising call, an allocation or another thread's use "
                               "of the legacy default stream invalidates a capture");
  scratch_generation_ = device_memory::scratch_generation();
  const cudaStream_t compute = cuda::stream();
  // Thread-local: only this thread's unsafe calls (synchronous copies, cudaMalloc, stream
  // synchronisation) are refused during the capture; other threads (the prefetcher's copy
  // streams) go on, as long as they stay off the legacy default stream.
  cudaError_t status = cudaStreamBeginCapture(compute, cudaStreamCaptureModeThreadLocal);
  if (status != cudaSuccess) capture_failed(name_, "cudaStreamBeginCapture", status);
  try {
    body();
  } catch (...) {
    // BODY threw (a UserError, say): end the capture, so the stream is usable again, and pass
    // the exception on. Whatever was captured is dropped.
    cudaGraph_t partial = nullptr;
    if (cudaStreamEndCapture(compute, &partial) != cudaSuccess) cudaGetLastError();
    if (partial != nullptr) cudaGraphDestroy(partial);
    throw;
  }
  cudaGraph_t graph = nullptr;
  status = cudaStreamEndCapture(compute, &graph);
  if (status != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    capture_failed(name_, "cudaStreamEndCapture", status);
  }
  if (graph == nullptr) capture_failed(name_, "cudaStreamEndCapture (no graph)", cudaErrorUnknown);
  cudaGraphExec_t exec = nullptr;
  status = cudaGraphInstantiate(&exec, graph, 0);  // CUDA 12+: flags, no error node or log
  if (status != cudaSuccess) {
    cudaGraphDestroy(graph);
    capture_failed(name_, "cudaGraphInstantiate", status);
  }
  graph_ = graph;
  exec_ = exec;
}

void StepGraph::replay() {
  if (exec_ == nullptr)
    abort_job("cuda graph '" + name_ + "': replay() before a successful capture()");
  if (device_memory::scratch_generation() != scratch_generation_)
    abort_job("cuda graph '" + name_ + "': a device scratch buffer was replaced by a larger one "
              "after the capture (a layer planned for more samples?), and the graph would use "
              "the freed block: plan every model before capturing");
  const cudaError_t status = cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), cuda::stream());
  if (status != cudaSuccess)
    abort_job("cuda graph '" + name_ + "': replay failed: cudaGraphLaunch: " +
              cuda::cuda_error_text(status));
}

}  // namespace mpt::kernels
