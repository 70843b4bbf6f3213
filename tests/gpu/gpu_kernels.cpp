// tests/gpu: every CUDA kernel against its host twin on the same random inputs, driven by the
// case table of kernel_cases.hpp. Without a CUDA device (or in a build without CUDA) it prints
// "SKIPPED: no CUDA device" and exits with kSkipCode, which CTest reports as skipped.
#include <cstdio>
#include <cstring>

#include "core/device_memory.hpp"
#include "tests/gpu/kernel_cases.hpp"

#ifdef MPTRAIN_HAVE_KOKKOS
#include <Kokkos_Core.hpp>
#endif

namespace {
constexpr int kSkipCode = 77;  // SKIP_RETURN_CODE in tests/gpu/CMakeLists.txt
}

int main(int argc, char** argv) {
  using namespace mpt::gpu_test;
  if (mpt::device_memory::cuda_device_count() == 0) {
    std::printf("SKIPPED: no CUDA device (%s)\n", mpt::device_memory::cuda_device_description().c_str());
    return kSkipCode;
  }
#ifdef MPTRAIN_HAVE_KOKKOS
  Kokkos::initialize(argc, argv);  // the host twins run on Kokkos in the full build
#endif
  const char* only = argc > 1 ? argv[1] : nullptr;  // optional: run the cases whose header matches
  std::printf("gpu_kernels on %s\n", mpt::device_memory::cuda_device_description().c_str());
  Harness harness;
  Random rng(20261129);
  int pending = 0;
  for (const KernelCase& entry : kKernelCases) {
    if (only && std::strstr(entry.header, only) == nullptr) continue;
    if (entry.status == CaseStatus::host_pending) {
      std::printf("pending %s (%s): host-only, no CUDA twin yet\n", entry.name, entry.header);
      ++pending;
      continue;
    }
    std::printf("case %s (%s)\n", entry.name, entry.header);
    entry.run(harness, rng);
  }
#ifdef MPTRAIN_HAVE_KOKKOS
  Kokkos::finalize();
#endif
  std::printf("%d pending (host-only)\n", pending);
  std::printf("%d passed, %d failed\n", harness.passed(), harness.failed());
  return harness.failed() == 0 ? 0 : 1;
}
