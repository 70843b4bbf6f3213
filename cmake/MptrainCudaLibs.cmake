# The CUDA libraries of the GPU backend, after enable_language(CUDA):
#   mpt_cuda_libs (INTERFACE): CUDA::cudart and cuBLASLt, plus cuDNN and NCCL when found, with
#   MPTRAIN_HAVE_CUDNN / MPTRAIN_HAVE_NCCL defined for what is there.
# cuBLASLt comes from the toolkit, or from pip (nvidia-cublas-cu*) when the toolkit lacks it.
# CMake 3.25.1 (Debian 12's) marks CUDA::nvToolsExt deprecated without checking that the
# target exists, and CUDA 13 has no nvToolsExt library, so its FindCUDAToolkit stops the
# configure. A placeholder target (never linked: mptrain uses no NVTX) lets it through.
if(CMAKE_VERSION VERSION_LESS 3.25.2 AND NOT TARGET CUDA::nvToolsExt)
  add_library(CUDA::nvToolsExt INTERFACE IMPORTED)
endif()
find_package(CUDAToolkit REQUIRED)
include(${CMAKE_CURRENT_LIST_DIR}/MptrainPipNvidia.cmake)
add_library(mpt_cuda_libs INTERFACE)
target_link_libraries(mpt_cuda_libs INTERFACE CUDA::cudart)
if(TARGET CUDA::cublasLt)
  target_link_libraries(mpt_cuda_libs INTERFACE CUDA::cublasLt)
  set(mpt_cublaslt "toolkit")
else()
  mpt_find_nvidia_library(CUBLASLT cublasLt.h cublasLt cublas)
  if(NOT CUBLASLT_LIBRARY OR NOT CUBLASLT_INCLUDE_DIR)
    message(FATAL_ERROR "cuBLASLt not found in the CUDA toolkit nor in <site-packages>/nvidia/cublas "
                        "(hint: install the toolkit's libcublas, or pip install nvidia-cublas-cu12, "
                        "or set CUBLASLT_ROOT)")
  endif()
  target_include_directories(mpt_cuda_libs SYSTEM INTERFACE ${CUBLASLT_INCLUDE_DIR})
  target_link_libraries(mpt_cuda_libs INTERFACE ${CUBLASLT_LIBRARY})
  set(mpt_cublaslt "${CUBLASLT_LIBRARY}")
endif()
find_package(CUDNN)
find_package(NCCL)
if(CUDNN_FOUND)
  target_link_libraries(mpt_cuda_libs INTERFACE CUDNN::cudnn)
  target_compile_definitions(mpt_cuda_libs INTERFACE MPTRAIN_HAVE_CUDNN=1)
endif()
if(NCCL_FOUND)
  target_link_libraries(mpt_cuda_libs INTERFACE NCCL::nccl)
  target_compile_definitions(mpt_cuda_libs INTERFACE MPTRAIN_HAVE_NCCL=1)
endif()
message(STATUS "mptrain: CUDA ${CUDAToolkit_VERSION}, cuBLASLt ${mpt_cublaslt}, "
               "cuDNN=${CUDNN_FOUND} ${CUDNN_VERSION}, NCCL=${NCCL_FOUND} ${NCCL_VERSION}")
