// tests/gpu: every CUDA kernel against its host twin on the same random inputs, driven by the
// case table of kernel_cases.hpp. Without a CUDA device (or in a build without CUDA) it prints
// "SKIPPED: no CUDA device" and exits with kSkipCode, which CTest reports as skipped.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/device_memory.hpp"
#include "tests/gpu/isolation.hpp"
#include "tests/gpu/kernel_cases.hpp"
#include "tests/gpu/overlap_cases.hpp"

#ifdef MPTRAIN_HAVE_KOKKOS
#include <Kokkos_Core.hpp>
#endif

namespace {
constexpr int kSkipCode = 77;  // SKIP_RETURN_CODE in tests/gpu/CMakeLists.txt
}

int main(int argc, char** argv) {
  using namespace mpt::gpu_test;
  const IsolationArgs args = parse_isolation_args(argc, argv);
  if (mpt::device_memory::cuda_device_count() == 0) {
    std::printf("SKIPPED: no CUDA device (%s)\n",
                mpt::device_memory::cuda_device_description().c_str());
    return kSkipCode;
  }
  // Optional: run the cases whose header matches.
  const char* only = args.rest.empty() ? nullptr : args.rest[0].c_str();
  std::vector<const KernelCase*> selected;
  int pending = 0;
  for (const KernelCase& entry : kKernelCases) {
    if (only && std::strstr(entry.header, only) == nullptr) continue;
    if (entry.status == CaseStatus::host_pending) {
      if (!args.child())
        std::printf("pending %s (%s): host-only, no CUDA twin yet\n", entry.name, entry.header);
      ++pending;
      continue;
    }
    selected.push_back(&entry);
  }
  if (!args.child())
    std::printf("gpu_kernels on %s\n", mpt::device_memory::cuda_device_description().c_str());
  // Each case in a process that a crash in an earlier one cannot take down (isolation.hpp),
  // on inputs of its own seed, so that it sees the same inputs wherever a process starts.
  const IsolatedTotals totals = run_isolated(
      args, static_cast<int>(selected.size()),
      [&](int i) { return std::string("case ") + selected[static_cast<std::size_t>(i)]->name; },
      [&](int i, Harness& harness) {
        const KernelCase& entry = *selected[static_cast<std::size_t>(i)];
        std::printf("case %s (%s)\n", entry.name, entry.header);
        Random rng(20261129 + static_cast<std::uint64_t>(i));
        entry.run(harness, rng);
        // The header's refusals of an output over an input, on the device (overlap_cases.hpp).
        check_overlap_refusals(harness, mpt::Device::cuda, entry.header);
      },
#ifdef MPTRAIN_HAVE_KOKKOS
      [&] { Kokkos::initialize(argc, argv); },  // the host twins run on Kokkos in the full build
      [] { Kokkos::finalize(); });
#else
      {}, {});
#endif
  std::printf("%d pending (host-only)\n", pending);
  return print_totals(totals);
}
