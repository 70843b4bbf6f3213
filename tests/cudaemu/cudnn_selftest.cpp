// The emulated cuDNN's own checks (tests/cudaemu/cudnn.cpp; docs/testing.md, "The CUDA
// emulator"): what it computes, against values worked out by hand (a convolution in both
// modes, TF32 under the default math, pooling with NaN and padding, alpha and beta, a captured
// call replayed), and what it refuses (a destroyed descriptor, a short workspace, a stream of
// another device, host memory, another device's memory, an output over an input). Built in the
// cuda-emu build; without cudnn.h it says it was skipped and exits 77. Ends with
// "N passed, N failed".
#include <cstdio>
#include <cstdlib>

#ifndef MPT_CUDAEMU_NO_CUDNN
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "tests/cudaemu/check.hpp"

namespace {

using mpt::cudaemu::check::device_floats;
using mpt::cudaemu::check::expect;
using mpt::cudaemu::check::expect_death;
using mpt::cudaemu::check::host_floats;

cudnnTensorDescriptor_t tensor(int n, int c, int h, int w) {
  cudnnTensorDescriptor_t d = nullptr;
  cudnnCreateTensorDescriptor(&d);
  cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c, h, w);
  return d;
}

// One f32 convolution: x 1x1x3x3 = 1..9, w 1x1x2x2 = {1, 2, 3, 4}, no padding, stride 1.
struct Conv {
  cudnnHandle_t handle = nullptr;
  cudnnTensorDescriptor_t xd = tensor(1, 1, 3, 3), yd = tensor(1, 1, 2, 2);
  cudnnFilterDescriptor_t wd = nullptr;
  cudnnConvolutionDescriptor_t cd = nullptr;
  float* x = device_floats({1, 2, 3, 4, 5, 6, 7, 8, 9});
  float* w = device_floats({1, 2, 3, 4});
  float* y = device_floats({0, 0, 0, 0});
  float* workspace = device_floats(std::vector<float>(256, 0.f));
  explicit Conv(cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION,
                cudnnMathType_t math = CUDNN_FMA_MATH) {
    cudnnCreate(&handle);
    cudnnCreateFilterDescriptor(&wd);
    cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 1, 1, 2, 2);
    cudnnCreateConvolutionDescriptor(&cd);
    cudnnSetConvolution2dDescriptor(cd, 0, 0, 1, 1, 1, 1, mode, CUDNN_DATA_FLOAT);
    cudnnSetConvolutionMathType(cd, math);
  }
  cudnnStatus_t forward(cudnnConvolutionFwdAlgo_t algo, std::size_t workspace_bytes,
                        float alpha = 1.f, float beta = 0.f) {
    return cudnnConvolutionForward(handle, &alpha, xd, x, wd, w, cd, algo, workspace,
                                   workspace_bytes, &beta, yd, y);
  }
};

}  // namespace

int main() {
  setenv("MPTRAIN_CUDAEMU_DEVICES", "2", 1);  // two devices, for the cross-device checks
  constexpr auto precomp = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
  constexpr auto implicit = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  {
    // Cross-correlation: y[0][0] = 1*1 + 2*2 + 4*3 + 5*4 = 37, then 47, 67, 77; convolution
    // flips the window: 1*4 + 2*3 + 4*2 + 5*1 = 23, then 33, 53, 63.
    Conv xcorr;
    std::size_t bytes = 0;
    cudnnGetConvolutionForwardWorkspaceSize(xcorr.handle, xcorr.xd, xcorr.wd, xcorr.cd, xcorr.yd,
                                            precomp, &bytes);
    expect(bytes > 0 && bytes <= 1024, "IMPLICIT_PRECOMP_GEMM asks for a small workspace");
    expect(xcorr.forward(precomp, bytes) == CUDNN_STATUS_SUCCESS, "forward runs");
    expect(host_floats(xcorr.y, 4) == std::vector<float>{37, 47, 67, 77},
           "cross-correlation = the hand-worked 37 47 67 77");
    const std::vector<float> scribbled = host_floats(xcorr.workspace, 1);
    std::uint32_t bits = 0;
    std::memcpy(&bits, scribbled.data(), 4);
    expect(bits == 0xa5a5a5a5u, "the algorithm's workspace is written over");
    // beta 1 adds to y; alpha scales.
    expect(xcorr.forward(implicit, 0, 0.5f, 1.f) == CUDNN_STATUS_SUCCESS &&
               host_floats(xcorr.y, 4) == std::vector<float>{55.5f, 70.5f, 100.5f, 115.5f},
           "y = 0.5 conv + 1 y");
    // beta 0 does not read y: a NaN there is gone.
    const float nan = std::numeric_limits<float>::quiet_NaN();
    cudaMemcpy(xcorr.y, &nan, 4, cudaMemcpyHostToDevice);
    expect(xcorr.forward(implicit, 0) == CUDNN_STATUS_SUCCESS && host_floats(xcorr.y, 1)[0] == 37,
           "beta 0 leaves a NaN in y unread");
    expect(xcorr.forward(precomp, bytes - 1) == CUDNN_STATUS_BAD_PARAM,
           "a workspace one byte short is refused");

    Conv flipped(CUDNN_CONVOLUTION);
    expect(flipped.forward(implicit, 0) == CUDNN_STATUS_SUCCESS &&
               host_floats(flipped.y, 4) == std::vector<float>{23, 33, 53, 63},
           "convolution mode flips the window: 23 33 53 63");

    // TF32 under the default math: x = 1 + 2^-12 is 1 in TF32 (10 significand bits).
    const float fine = 1.f + std::ldexp(1.f, -12);
    Conv fma, tf32(CUDNN_CROSS_CORRELATION, CUDNN_DEFAULT_MATH);
    for (Conv* c : {&fma, &tf32}) {
      cudaMemcpy(c->x, &fine, 4, cudaMemcpyHostToDevice);
      const std::vector<float> one_w{1, 0, 0, 0};
      cudaMemcpy(c->w, one_w.data(), 16, cudaMemcpyHostToDevice);
      c->forward(implicit, 0);
    }
    expect(host_floats(fma.y, 1)[0] == fine, "f32 under CUDNN_FMA_MATH keeps f32");
    expect(host_floats(tf32.y, 1)[0] == 1.f, "f32 under CUDNN_DEFAULT_MATH rounds to TF32");

    // The heuristics: ranked, with non-deterministic and tensor-op entries to pass over.
    int count = 0;
    cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(xcorr.handle, &count);
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> ranked(static_cast<std::size_t>(count));
    int returned = 0;
    cudnnGetConvolutionBackwardFilterAlgorithm_v7(xcorr.handle, xcorr.xd, xcorr.yd, xcorr.cd,
                                                  xcorr.wd, count, &returned, ranked.data());
    bool non_deterministic = false, tensor_op = false;
    for (int i = 0; i < returned; ++i) {
      non_deterministic |= ranked[i].determinism == CUDNN_NON_DETERMINISTIC;
      tensor_op |= ranked[i].mathType == CUDNN_TENSOR_OP_MATH;
    }
    expect(returned > 2 && ranked[0].determinism == CUDNN_NON_DETERMINISTIC && tensor_op &&
               non_deterministic,
           "backward filter: a non-deterministic algorithm ranks first, tensor-op ones follow");

    // Refusals with a status.
    cudnnTensorDescriptor_t gone = tensor(1, 1, 3, 3);
    cudnnDestroyTensorDescriptor(gone);
    float one = 1.f, zero = 0.f;
    expect(cudnnConvolutionForward(xcorr.handle, &one, gone, xcorr.x, xcorr.wd, xcorr.w, xcorr.cd,
                                   implicit, nullptr, 0, &zero, xcorr.yd,
                                   xcorr.y) == CUDNN_STATUS_BAD_PARAM,
           "a destroyed descriptor is refused");
    cudnnTensorDescriptor_t wrong = tensor(1, 1, 3, 2);
    expect(cudnnConvolutionForward(xcorr.handle, &one, xcorr.xd, xcorr.x, xcorr.wd, xcorr.w,
                                   xcorr.cd, implicit, nullptr, 0, &zero, wrong,
                                   xcorr.y) == CUDNN_STATUS_BAD_PARAM,
           "a y that is not the output's shape is refused");
    cudaSetDevice(1);
    cudaStream_t other = nullptr;
    cudaStreamCreate(&other);
    cudaSetDevice(0);
    expect(cudnnSetStream(xcorr.handle, other) == CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH,
           "a stream of another device is refused");

    // Faults end the process, naming the call and the argument.
    expect_death("host memory as x", "x (36 bytes) is not inside one device allocation", [&] {
      std::vector<float> host(9, 1.f);
      cudnnConvolutionForward(xcorr.handle, &one, xcorr.xd, host.data(), xcorr.wd, xcorr.w,
                              xcorr.cd, implicit, nullptr, 0, &zero, xcorr.yd, xcorr.y);
    });
    expect_death("y over x", "cudnnConvolutionForward: y overlaps x", [&] {
      xcorr.forward(implicit, 0);
      cudnnConvolutionForward(xcorr.handle, &one, xcorr.xd, xcorr.x, xcorr.wd, xcorr.w, xcorr.cd,
                              implicit, nullptr, 0, &zero, xcorr.yd, xcorr.x + 4);
    });
    expect_death("another device's memory", "x is memory of device 1", [&] {
      cudaSetDevice(1);
      float* far = device_floats(std::vector<float>(9, 1.f));
      cudaSetDevice(0);
      cudnnConvolutionForward(xcorr.handle, &one, xcorr.xd, far, xcorr.wd, xcorr.w, xcorr.cd,
                              implicit, nullptr, 0, &zero, xcorr.yd, xcorr.y);
    });

    // What the emulator does not model ends the process naming it (mptrain asks for neither).
    expect_death("an NHWC tensor", "not modelled by the emulator: cuDNN tensors other than NCHW",
                 [&] {
                   cudnnTensorDescriptor_t nhwc = nullptr;
                   cudnnCreateTensorDescriptor(&nhwc);
                   cudnnSetTensor4dDescriptor(nhwc, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, 1, 1, 3, 3);
                 });
    expect_death("a HALF compute type",
                 "not modelled by the emulator: cuDNN convolution with a compute type other than FLOAT",
                 [&] {
                   cudnnSetConvolution2dDescriptor(xcorr.cd, 0, 0, 1, 1, 1, 1,
                                                   CUDNN_CROSS_CORRELATION, CUDNN_DATA_HALF);
                   xcorr.forward(implicit, 0);
                 });

    // A call on a capturing stream is recorded and replayed, not run at the call.
    cudaStream_t stream = nullptr;
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    cudnnSetStream(xcorr.handle, stream);
    cudaMemset(xcorr.y, 0, 16);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    const cudnnStatus_t captured = xcorr.forward(implicit, 0);
    cudaStreamEndCapture(stream, &graph);
    cudaStreamSynchronize(stream);
    const bool not_yet = host_floats(xcorr.y, 1)[0] == 0.f;
    cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphLaunch(exec, stream);
    cudaStreamSynchronize(stream);
    expect(captured == CUDNN_STATUS_SUCCESS && not_yet && host_floats(xcorr.y, 1)[0] == 37.f,
           "a captured forward runs at the graph's launch");
  }
  {
    // Pooling a 1x1x3x3 plane 1..9 with 2x2 windows at stride 1: max 5 6 8 9; with pad 1 and
    // stride 2 the average excluding padding is 1, 2.5, 5.5, 7 (windows {1}, {2,3}, {4,7},
    // {5,6,8,9}), and including it 0.25, 1.25, 2.75, 7.
    cudnnHandle_t handle = nullptr;
    cudnnCreate(&handle);
    cudnnTensorDescriptor_t xd = tensor(1, 1, 3, 3), yd = tensor(1, 1, 2, 2);
    float* x = device_floats({1, 2, 3, 4, 5, 6, 7, 8, 9});
    float* y = device_floats({0, 0, 0, 0});
    float* dy = device_floats({1, 2, 3, 4});
    float* dx = device_floats(std::vector<float>(9, 0.f));
    const float one = 1.f, zero = 0.f;
    const auto pool = [&](cudnnPoolingMode_t mode, int pad, int stride) {
      cudnnPoolingDescriptor_t pd = nullptr;
      cudnnCreatePoolingDescriptor(&pd);
      cudnnSetPooling2dDescriptor(pd, mode, CUDNN_PROPAGATE_NAN, 2, 2, pad, pad, stride, stride);
      cudnnPoolingForward(handle, pd, &one, xd, x, &zero, yd, y);
      cudnnPoolingBackward(handle, pd, &one, yd, y, yd, dy, xd, x, &zero, xd, dx);
      cudnnDestroyPoolingDescriptor(pd);
    };
    pool(CUDNN_POOLING_MAX_DETERMINISTIC, 0, 1);
    expect(host_floats(y, 4) == std::vector<float>{5, 6, 8, 9}, "max pooling: 5 6 8 9");
    expect(host_floats(dx, 9) == std::vector<float>{0, 0, 0, 0, 1, 2, 0, 3, 4},
           "max pooling's gradient goes to each window's maximum");
    pool(CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING, 1, 2);
    expect(host_floats(y, 4) == std::vector<float>{1, 2.5f, 5.5f, 7},
           "average excluding padding: 1 2.5 5.5 7");
    pool(CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING, 1, 2);
    expect(host_floats(y, 4) == std::vector<float>{0.25f, 1.25f, 2.75f, 7},
           "average including padding: 0.25 1.25 2.75 7");
    const float nan = std::numeric_limits<float>::quiet_NaN();
    cudaMemcpy(x + 4, &nan, 4, cudaMemcpyHostToDevice);
    pool(CUDNN_POOLING_MAX_DETERMINISTIC, 0, 1);
    const std::vector<float> got = host_floats(y, 4);
    expect(std::isnan(got[0]) && std::isnan(got[1]) && std::isnan(got[2]) && std::isnan(got[3]),
           "CUDNN_PROPAGATE_NAN: a NaN in every window makes every output NaN");
  }
  return mpt::cudaemu::check::report();
}

#else
int main() {
  std::printf(
      "cudaemu cuDNN self-test SKIPPED: the toolkit has no cudnn.h, so cuDNN is not "
      "emulated\n");
  return 77;
}
#endif
