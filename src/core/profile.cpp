// NVTX v3 ranges (see profile.hpp). The header defines everything inline; a tool, when one is
// injected (NVTX_INJECTION64_PATH, or a static injection such as the CUDA emulator's), fills
// in the functions at the first call.
#include "core/profile.hpp"

#if defined(MPTRAIN_HAVE_CUDA) && __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define MPT_HAVE_NVTX 1
#endif

namespace mpt::profile {

#ifdef MPT_HAVE_NVTX
void push(const char* name) { nvtxRangePushA(name); }
void pop() { nvtxRangePop(); }
#else
void push(const char*) {}
void pop() {}
#endif

}  // namespace mpt::profile
