// Failure paths of the kernel precondition checks (kept out of line so the checks stay cheap).
#include "kernels/check.hpp"

#include <string>

#include "core/error.hpp"

namespace mpt::kernels::detail {

void fail(const char* op, const char* what, const Tensor& tensor) {
  abort_job(std::string(op) + ": " + what + " (got " +
            (tensor.defined() ? tensor.describe() : std::string("an undefined tensor")) + ")");
}

void fail_pair(const char* op, const char* what, const Tensor& a, const Tensor& b) {
  abort_job(std::string(op) + ": " + what + " (got " + a.describe() + " and " + b.describe() + ")");
}

void built_without_cuda(const char* op) {
  abort_job(std::string(op) + ": tensor is on the cuda device but this build has no CUDA kernels");
}

}  // namespace mpt::kernels::detail
