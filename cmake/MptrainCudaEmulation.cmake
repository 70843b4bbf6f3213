# The CUDA emulation build (MPTRAIN_CUDA_EMULATION, the cuda-emu preset; docs/testing.md "The
# CUDA emulator"): the .cu files of kernels/cuda compile as host C++ (tests/cudaemu/
# rewrite_launches.py turns each <<<...>>> launch into a call of the emulator) and link the
# emulator's CUDA runtime and cuBLASLt (tests/cudaemu) instead of NVIDIA's, so the CUDA twins,
# the cuda paths of nn, amp and optim, and the device tests run on a machine without a GPU.
# Where the toolkit has cudnn.h, the emulator's cuDNN (tests/cudaemu/cudnn.cpp) stands in for
# the library, so the conv and pooling layers take their cuDNN path (MPTRAIN_HAVE_CUDNN), as
# on a GPU machine, and MPTRAIN_CUDA_CONV=im2col still selects their own kernels. Where it has
# nccl.h, the emulator's NCCL (tests/cudaemu/nccl.cpp: the ranks' processes through shared
# memory) lets src/comm build its nccl all-reduce backend.
# The toolkit's headers give the types and the host halves of the 16-bit conversions.
find_path(MPTRAIN_CUDA_INCLUDE_DIR cuda_runtime_api.h
          HINTS ENV CUDA_HOME ENV CUDA_PATH
          PATHS /usr/local/cuda /usr
          PATH_SUFFIXES include)
if(NOT MPTRAIN_CUDA_INCLUDE_DIR OR NOT EXISTS "${MPTRAIN_CUDA_INCLUDE_DIR}/cublasLt.h")
  message(FATAL_ERROR "MPTRAIN_CUDA_EMULATION needs the CUDA toolkit's headers (cuda_runtime_api.h, "
                      "cublasLt.h) (hint: install the toolkit, or set CUDA_HOME)")
endif()
find_package(Python3 REQUIRED COMPONENTS Interpreter)
# MPTRAIN_CUDAEMU_<NAME> is ON where the toolkit (or $<NAME>_ROOT) has HEADER: that library is
# emulated too; MPTRAIN_<NAME>_INCLUDE_DIR is where the header is.
macro(mpt_cudaemu_library name header)
  find_path(MPTRAIN_${name}_INCLUDE_DIR ${header}
            HINTS ${MPTRAIN_CUDA_INCLUDE_DIR} ENV ${name}_ROOT
            PATHS /usr/local/cuda /usr
            PATH_SUFFIXES include)
  set(MPTRAIN_CUDAEMU_${name} OFF)
  if(MPTRAIN_${name}_INCLUDE_DIR)
    set(MPTRAIN_CUDAEMU_${name} ON)
  endif()
endmacro()
mpt_cudaemu_library(CUDNN cudnn.h)
mpt_cudaemu_library(NCCL nccl.h)

add_library(mpt_cudaemu STATIC
  ${PROJECT_SOURCE_DIR}/tests/cudaemu/runtime.cpp
  ${PROJECT_SOURCE_DIR}/tests/cudaemu/cublaslt.cpp)
target_include_directories(mpt_cudaemu PUBLIC ${PROJECT_SOURCE_DIR})
target_include_directories(mpt_cudaemu SYSTEM PUBLIC ${MPTRAIN_CUDA_INCLUDE_DIR})
# No fused multiply-adds: __fmul_rn and friends are plain operations here.
target_compile_options(mpt_cudaemu PUBLIC -ffp-contract=off)
target_link_libraries(mpt_cudaemu PUBLIC Threads::Threads)
if(MPTRAIN_CUDAEMU_CUDNN)
  target_sources(mpt_cudaemu PRIVATE ${PROJECT_SOURCE_DIR}/tests/cudaemu/cudnn.cpp)
  target_include_directories(mpt_cudaemu SYSTEM PUBLIC ${MPTRAIN_CUDNN_INCLUDE_DIR})
endif()
if(MPTRAIN_CUDAEMU_NCCL)
  target_sources(mpt_cudaemu PRIVATE ${PROJECT_SOURCE_DIR}/tests/cudaemu/nccl.cpp)
  target_include_directories(mpt_cudaemu SYSTEM PUBLIC ${MPTRAIN_NCCL_INCLUDE_DIR})
  # src/comm builds its nccl backend against it, as against NCCL (NCCL_FOUND, NCCL::nccl).
  add_library(NCCL::nccl ALIAS mpt_cudaemu)
  set(NCCL_FOUND TRUE)
endif()
# Under the names the rest of the build links (src/core: CUDA::cudart; kernels: mpt_cuda_libs).
add_library(CUDA::cudart ALIAS mpt_cudaemu)
add_library(mpt_cuda_libs INTERFACE)
target_link_libraries(mpt_cuda_libs INTERFACE mpt_cudaemu)
if(MPTRAIN_CUDAEMU_CUDNN)
  target_compile_definitions(mpt_cuda_libs INTERFACE MPTRAIN_HAVE_CUDNN=1)
endif()
message(STATUS "mptrain: CUDA emulation, cuDNN emulated=${MPTRAIN_CUDAEMU_CUDNN}, "
               "NCCL emulated=${MPTRAIN_CUDAEMU_NCCL}")

set(MPTRAIN_CUDAEMU_DIR ${PROJECT_BINARY_DIR}/cudaemu)
set(_mpt_rewrite ${PROJECT_SOURCE_DIR}/tests/cudaemu/rewrite_launches.py)

# mpt_cudaemu_rewrite(OUT SOURCE): OUT is the host C++ that the emulator compiles for SOURCE (a
# .cu or .cuh under the project), generated at build time under ${MPTRAIN_CUDAEMU_DIR} with the
# same relative path (a .cu becomes .cpp), so that `#include "kernels/cuda/common.cuh"` finds
# the rewritten header first (mpt_cudaemu_sources puts that directory before the sources').
function(mpt_cudaemu_rewrite out source)
  file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${source})
  string(REGEX REPLACE "\\.cu$" ".cpp" generated_rel ${rel})
  set(generated ${MPTRAIN_CUDAEMU_DIR}/${generated_rel})
  add_custom_command(OUTPUT ${generated}
    COMMAND ${Python3_EXECUTABLE} ${_mpt_rewrite} ${source} ${generated}
    DEPENDS ${source} ${_mpt_rewrite}
    COMMENT "cudaemu: rewriting ${rel}"
    VERBATIM)
  set(${out} ${generated} PARENT_SCOPE)
endfunction()

# mpt_cudaemu_sources(TARGET DIR HEADERS h.cuh... SOURCES a.cu...): the emulator's twin of
# target_sources for the .cu files of DIR; HEADERS are the .cuh files there that they include,
# rewritten too.
function(mpt_cudaemu_sources target dir)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "" "HEADERS;SOURCES")
  set(generated_headers "")
  foreach(header ${arg_HEADERS})
    mpt_cudaemu_rewrite(generated ${dir}/${header})
    list(APPEND generated_headers ${generated})
  endforeach()
  foreach(source ${arg_SOURCES})
    mpt_cudaemu_rewrite(generated ${dir}/${source})
    target_sources(${target} PRIVATE ${generated})
    # #pragma unroll is nvcc's; g++ would warn about each. The #line directives that point
    # g++ at the .cu make it take the file for a header, where a member of an anonymous
    # namespace's type draws -Wsubobject-linkage; it is the main file, as for nvcc.
    set_source_files_properties(${generated} PROPERTIES OBJECT_DEPENDS "${generated_headers}"
                                COMPILE_OPTIONS "-Wno-unknown-pragmas;-Wno-subobject-linkage")
  endforeach()
  target_include_directories(${target} BEFORE PRIVATE ${MPTRAIN_CUDAEMU_DIR})
  target_link_libraries(${target} PRIVATE mpt_cudaemu)
endfunction()
