// Runs everywhere (CI included, no GPU needed): checks the case table of kernel_cases.hpp
// against the op headers in kernels/. Fails when a header has no row, a row names a missing
// header, a CUDA row has no case, or a header that declares cuda:: twins (or is device-level:
// copy.hpp, graph.hpp) is marked host-only.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "tests/gpu/kernel_cases.hpp"

namespace {
int passed = 0, failed = 0;
void check(bool ok, const std::string& what) {
  ++(ok ? passed : failed);
  std::printf("  %s  %s\n", ok ? "ok  " : "FAIL", what.c_str());
}
std::string read(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}
}  // namespace

int main(int argc, char** argv) {
  using namespace mpt::gpu_test;
  const std::filesystem::path dir = argc > 1 ? argv[1] : MPT_KERNELS_DIR;
  if (!std::filesystem::is_directory(dir)) {
    std::fprintf(stderr, "gpu_case_table: %s is not the kernels/ folder (hint: pass it as argument)\n",
                 dir.c_str());
    return 2;
  }
  std::set<std::string> headers;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().extension() == ".hpp" && entry.path().filename() != "check.hpp")
      headers.insert(entry.path().filename().string());
  for (const std::string& header : headers) {
    bool listed = false, pending = false, cuda = false;
    for (const KernelCase& row : kKernelCases)
      if (header == row.header) {
        listed = true;
        pending = pending || row.status == CaseStatus::host_pending;
        cuda = cuda || row.status == CaseStatus::cuda;
      }
    check(listed, "kernels/" + header + " has a row in tests/gpu/kernel_cases.hpp");
    if (!listed) continue;
    const bool declares_cuda = read(dir / header).find("namespace cuda {") != std::string::npos;
    // Not ops with host and cuda twins: copy.hpp copies across devices itself, and graph.hpp
    // captures the compute stream (kernels/cuda/graph.cu); both have a CUDA case all the same.
    const char* device_level = header == "copy.hpp"    ? " copies across devices itself"
                               : header == "graph.hpp" ? " captures the compute stream itself"
                                                       : nullptr;
    if (declares_cuda)
      check(cuda && !pending,
            "kernels/" + header + " declares cuda:: twins, so its row must run them (not host-only)");
    else if (device_level)
      check(cuda && !pending,
            "kernels/" + header + device_level + " (no cuda:: twins): its row must run its case");
    else
      check(pending,
            "kernels/" + header + " has no cuda:: twins, so its row must say host-only, pending");
  }
  for (const KernelCase& row : kKernelCases) {
    check(headers.count(row.header) == 1, std::string("row '") + row.name + "' names an existing header");
    check((row.status == CaseStatus::cuda) == (row.run != nullptr),
          std::string("row '") + row.name + "' has a case exactly when it is a CUDA row");
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
