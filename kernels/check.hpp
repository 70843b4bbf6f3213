// Precondition checks shared by the kernel launchers. The fast path is a compare or two; a
// message is built only on failure, so a launcher never allocates in the training step.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/tensor.hpp"

// The device dispatch of a launcher in kernels/<op>.hpp: when TENSOR is on the cuda device,
// return cuda::OP(args...) (kernels/cuda/OP.cu) in a CUDA build, or abort naming the op in a
// build without CUDA. The host path follows the macro in the launcher.
#ifdef MPTRAIN_HAVE_CUDA
#define MPT_DISPATCH_CUDA(tensor, op, ...) \
  if ((tensor).device() != ::mpt::Device::cpu) return cuda::op(__VA_ARGS__)
#else
#define MPT_DISPATCH_CUDA(tensor, op, ...)        \
  if ((tensor).device() != ::mpt::Device::cpu) \
  ::mpt::kernels::detail::built_without_cuda("kernels::" #op)
#endif

namespace mpt::kernels::detail {

// Aborts the job with "OP: WHAT (got <tensor description>)". Kernel misuse is a bug in the
// caller, not a user mistake, hence abort_job rather than a UserError.
[[noreturn]] void fail(const char* op, const char* what, const Tensor& tensor);
// Aborts the job with "OP: WHAT (got A and B)", for mismatches between two tensors.
[[noreturn]] void fail_pair(const char* op, const char* what, const Tensor& a, const Tensor& b);
// Aborts the job because a tensor lives on a device this build has no kernels for.
[[noreturn]] void built_without_cuda(const char* op);

inline void require(bool ok, const char* op, const char* what, const Tensor& tensor) {
  if (!ok) fail(op, what, tensor);
}
inline void require_pair(bool ok, const char* op, const char* what, const Tensor& a,
                         const Tensor& b) {
  if (!ok) fail_pair(op, what, a, b);
}
// True when A and B share a byte: two views of one buffer that meet, or one tensor passed twice.
// Tensors are contiguous, so each is the byte range [raw, raw + size_bytes); an empty one shares
// nothing. Tensors on two devices never share memory (CUDA's unified addressing keeps host and
// device ranges apart).
inline bool overlap(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || a.device() != b.device()) return false;
  if (a.numel() == 0 || b.numel() == 0) return false;
  // As integers: pointers into two allocations have no order that < may rely on.
  const auto pa = reinterpret_cast<std::uintptr_t>(a.raw());
  const auto pb = reinterpret_cast<std::uintptr_t>(b.raw());
  return pa < pb + b.size_bytes() && pb < pa + a.size_bytes();
}
// For an output that a kernel writes while it still reads an input (other rows or windows,
// another layout or element width), where an overlap gives wrong values rather than an error:
// OUT must share no byte with IN. Checked in the launchers of kernels/<op>.hpp, before the
// device dispatch, so that the host and CUDA twins refuse alike.
inline void require_disjoint(const char* op, const char* what, const Tensor& in,
                             const Tensor& out) {
  if (overlap(in, out)) fail_pair(op, what, in, out);
}
// For element-wise kernels, which may run in place: OUT is IN itself (the same first byte, dtype
// and element count) or shares no byte with it. A shifted view, or another element width over
// the same bytes, would read elements that the kernel has already written.
inline void require_same_or_disjoint(const char* op, const char* what, const Tensor& in,
                                     const Tensor& out) {
  if (overlap(in, out) &&
      !(in.raw() == out.raw() && in.dtype() == out.dtype() && in.numel() == out.numel()))
    fail_pair(op, what, in, out);
}
// One of the buffers that a kernel updates at the same index (an optimizer's parameters, its
// gradients, its state, the recast copies); TENSOR may be null for an optional one.
struct Operand {
  const char* name;
  const Tensor* tensor;
};
// No two of OPERANDS share a byte: "OP: <later> must not overlap <earlier>" otherwise.
inline void require_pairwise_disjoint(const char* op, std::initializer_list<Operand> operands) {
  for (auto later = operands.begin(); later != operands.end(); ++later)
    for (auto earlier = operands.begin(); earlier != later; ++earlier)
      if (later->tensor && earlier->tensor && overlap(*earlier->tensor, *later->tensor))
        fail_pair(op, (std::string(later->name) + " must not overlap " + earlier->name).c_str(),
                  *earlier->tensor, *later->tensor);
}
// A defined f32 tensor on the host: what every host kernel here computes on.
inline void require_host_f32(const char* op, const char* what, const Tensor& tensor) {
  require(tensor.defined() && tensor.dtype() == DType::f32 && tensor.device() == Device::cpu, op,
          what, tensor);
}

}  // namespace mpt::kernels::detail
