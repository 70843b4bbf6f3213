// kernels/graph.hpp in a build without CUDA (compiled only then; kernels/cuda/graph.cu is the
// real one): there is no compute stream to capture, so graphs are never supported.
#include "kernels/graph.hpp"

#include <utility>

#include "core/error.hpp"

namespace mpt::kernels {
namespace {

[[noreturn]] void no_cuda(const std::string& name, const char* what) {
  abort_job("cuda graph '" + name + "': cannot " + what +
            ": this build has no CUDA (hint: rebuild with -DMPTRAIN_ENABLE_CUDA=ON, or run "
            "without --cuda.graphs)");
}

}  // namespace

bool graphs_supported() { return false; }

void* capture_stream() { return nullptr; }

StepGraph::StepGraph(std::string name) : name_(std::move(name)) {}

StepGraph::~StepGraph() = default;

void StepGraph::capture(const std::function<void()>&) { no_cuda(name_, "capture"); }

void StepGraph::replay() { no_cuda(name_, "replay"); }

}  // namespace mpt::kernels
