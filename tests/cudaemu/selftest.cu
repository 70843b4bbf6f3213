// The CUDA emulator's own checks (docs/testing.md, "The CUDA emulator"): what it must compute
// (barriers, shuffles, a grid-stride loop, stream capture and replay) and what it must refuse
// (a barrier in divergent code, a shuffle with an exited lane, a host pointer handed to a
// kernel, another device's stream or memory, a bad launch configuration, a synchronous call
// inside a capture), and that deferred streams run work as late as CUDA allows (a reader that
// does not wait for its writer reads stale memory). Compiled through
// rewrite_launches.py like kernels/cuda, in the cuda-emu build only. Ends with
// "N passed, N failed".
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <nvtx3/nvToolsExt.h>

#include "tests/cudaemu/check.hpp"

namespace {

using mpt::cudaemu::check::expect;
using mpt::cudaemu::check::expect_death;

// A block's sum through shared memory and a barrier, then warp shuffles: both must see every
// thread's value, whichever order the emulator runs them in.
__global__ void block_sums(const int* values, int n, int* sums) {
  __shared__ int slots[256];
  int mine = 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    mine += values[i];
  slots[threadIdx.x] = mine;
  __syncthreads();
  if (threadIdx.x < 32) {
    int sum = 0;
    for (int t = threadIdx.x; t < 256; t += 32) sum += slots[t];
    for (int offset = 16; offset > 0; offset /= 2)
      sum += __shfl_down_sync(0xffffffffu, sum, offset);
    sum = __shfl_sync(0xffffffffu, sum, 0);
    if (threadIdx.x == 5) sums[blockIdx.x] = sum;  // lane 5 got lane 0's total
  }
}

__global__ void divergent_barrier(int* out) {
  if (threadIdx.x % 2 == 0) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void shuffle_after_exit(int* out) {
  if (threadIdx.x == 3) return;
  out[threadIdx.x] = __shfl_down_sync(0xffffffffu, static_cast<int>(threadIdx.x), 1);
}

__global__ void add_one(int* values, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    values[i] += 1;
}

__global__ void fill(int* values, int n, int value) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    values[i] = value;
}

__global__ void copy_values(const int* from, int* to, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    to[i] = from[i];
}

// A device value, read through the legacy stream (which runs the blocking streams' work first).
int read_first(const int* device_values) {
  int value = -1;
  cudaMemcpy(&value, device_values, sizeof value, cudaMemcpyDeviceToHost);
  return value;
}

// Two device buffers for the stream-order checks, WRITTEN (reset to 1) and READ (reset to 0),
// and an event.
struct OrderBuffers {
  static constexpr int n = 64;
  int* written = nullptr;
  int* read = nullptr;
  cudaEvent_t event = nullptr;
  OrderBuffers() {
    cudaMalloc(reinterpret_cast<void**>(&written), n * sizeof(int));
    cudaMalloc(reinterpret_cast<void**>(&read), n * sizeof(int));
    cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  }
  void reset() {
    fill<<<1, 64>>>(written, n, 1);
    fill<<<1, 64>>>(read, n, 0);
    cudaDeviceSynchronize();
  }
};

// Deferred streams: work runs as late as CUDA allows, so that a reader that does not wait for
// its writer (another stream, or the host) reads what was there before.
void check_deferred_streams() {
  OrderBuffers buffers;
  constexpr int n = OrderBuffers::n;
  int *written = buffers.written, *read = buffers.read;
  cudaEvent_t event = buffers.event;
  const auto reset = [&] { buffers.reset(); };
  cudaStream_t a = nullptr, b = nullptr, blocking = nullptr;
  cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
  cudaStreamCreate(&blocking);

  // (a) Stream b reads what stream a writes, without waiting for it.
  reset();
  fill<<<1, 64, 0, a>>>(written, n, 2);
  copy_values<<<1, 64, 0, b>>>(written, read, n);
  cudaStreamSynchronize(b);
  cudaStreamSynchronize(a);
  expect(read_first(read) == 1 && read_first(written) == 2,
         "deferred: a stream that does not wait for another's write reads the old value (" +
             std::to_string(read_first(read)) + ")");

  // (b) The same with an event wait; a later record of the event does not move the wait.
  reset();
  fill<<<1, 64, 0, a>>>(written, n, 2);
  cudaEventRecord(event, a);
  cudaStreamWaitEvent(b, event, 0);
  copy_values<<<1, 64, 0, b>>>(written, read, n);
  fill<<<1, 64, 0, a>>>(written, n, 3);
  cudaEventRecord(event, a);
  cudaStreamSynchronize(b);
  expect(read_first(read) == 2,
         "deferred: after cudaEventRecord + cudaStreamWaitEvent it reads the write before the "
         "record, not the one before the event's next record (" +
             std::to_string(read_first(read)) + ")");
  const cudaError_t not_reached = cudaEventQuery(event);
  cudaEventSynchronize(event);
  expect(not_reached == cudaErrorNotReady && read_first(written) == 3,
         "deferred: cudaEventQuery says cudaErrorNotReady, cudaEventSynchronize runs the stream "
         "to the record");

  // (c) The host and pinned memory: a copy into it has not landed before a synchronisation,
  // and a copy out of it reads what the host writes there until the copy runs.
  int* pinned = nullptr;
  cudaHostAlloc(reinterpret_cast<void**>(&pinned), n * sizeof(int), cudaHostAllocPortable);
  reset();
  pinned[0] = 0;
  cudaMemcpyAsync(pinned, written, n * sizeof(int), cudaMemcpyDeviceToHost, a);
  expect(pinned[0] == 0, "deferred: the host reads pinned memory before the copy into it landed");
  const cudaError_t queued = cudaStreamQuery(a);
  expect(queued == cudaErrorNotReady,
         std::string("deferred: cudaStreamQuery of a stream with queued work: ") +
             cudaGetErrorName(queued));
  cudaStreamSynchronize(a);
  expect(pinned[0] == 1 && cudaStreamQuery(a) == cudaSuccess,
         "deferred: after cudaStreamSynchronize the host reads the copy (" +
             std::to_string(pinned[0]) + ")");
  pinned[0] = 5;
  cudaMemcpyAsync(written, pinned, sizeof(int), cudaMemcpyHostToDevice, a);
  pinned[0] = 6;  // reused before the copy out of it ran
  cudaStreamSynchronize(a);
  expect(read_first(written) == 6,
         "deferred: a pinned buffer that the host rewrites before the copy out of it ran gives "
         "the rewritten value (" +
             std::to_string(read_first(written)) + ")");
  cudaFreeHost(pinned);

  // (d) The legacy stream waits for the blocking streams' work queued before it, and they for
  // its; a non-blocking stream takes no part.
  reset();
  fill<<<1, 64, 0, blocking>>>(written, n, 4);
  copy_values<<<1, 64>>>(written, read, n);
  cudaStreamSynchronize(cudaStreamLegacy);
  cudaStreamSynchronize(blocking);  // nothing queued after the legacy stream's copy
  int got = -1;
  std::memcpy(&got, read, sizeof got);  // device memory is host memory here: no copy to run
  expect(got == 4,
         "deferred: the legacy stream waits for a blocking stream (" + std::to_string(got) + ")");
  reset();
  fill<<<1, 64>>>(written, n, 5);
  copy_values<<<1, 64, 0, blocking>>>(written, read, n);
  cudaStreamSynchronize(blocking);
  std::memcpy(&got, read, sizeof got);
  expect(got == 5,
         "deferred: a blocking stream waits for the legacy stream (" + std::to_string(got) + ")");
  reset();
  fill<<<1, 64>>>(written, n, 6);
  copy_values<<<1, 64, 0, a>>>(written, read, n);
  cudaStreamSynchronize(a);
  std::memcpy(&got, read, sizeof got);
  expect(got == 1, "deferred: a non-blocking stream does not wait for the legacy stream (" +
                       std::to_string(got) + ")");
  cudaDeviceSynchronize();

  // A graph launch is one queued item, which a graph destroyed in flight still runs.
  reset();
  cudaGraph_t graph = nullptr;
  cudaStreamBeginCapture(a, cudaStreamCaptureModeThreadLocal);
  add_one<<<1, 64, 0, a>>>(written, n);
  cudaStreamEndCapture(a, &graph);
  cudaGraphExec_t exec = nullptr;
  cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphLaunch(exec, a);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  std::memcpy(&got, written, sizeof got);
  cudaDeviceSynchronize();
  int after_graph = -1;
  std::memcpy(&after_graph, written, sizeof after_graph);
  expect(got == 1 && after_graph == 2,
         "deferred: a graph launch waits in its stream's queue until a synchronisation (" +
             std::to_string(got) + ", then " + std::to_string(after_graph) + ")");

  cudaEventDestroy(event);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
  cudaStreamDestroy(blocking);
  cudaFree(written);
  cudaFree(read);
}

// Early side streams (MPTRAIN_CUDAEMU_STREAMS=early, `cudaemu_selftest --early`): blocking
// streams stay deferred; a non-blocking stream's work runs at the call once what it waits for
// has run, so a side stream that does not wait for the compute stream runs ahead of it.
int check_early_streams() {
  OrderBuffers buffers;
  constexpr int n = OrderBuffers::n;
  int *written = buffers.written, *read = buffers.read;
  cudaEvent_t event = buffers.event;
  const auto reset = [&] { buffers.reset(); };
  cudaStream_t compute = nullptr, side = nullptr;
  cudaStreamCreate(&compute);  // blocking, as kernels/cuda/runtime.cu makes the compute stream
  cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
  // Device memory is host memory here: read directly, it shows what has run so far.
  reset();
  fill<<<1, 64, 0, compute>>>(written, n, 2);
  expect(written[0] == 1, "early: a blocking stream's work stays queued");
  copy_values<<<1, 64, 0, side>>>(written, read, n);
  expect(read[0] == 1, "early: a side stream that does not wait copies at the call, the old value");
  cudaDeviceSynchronize();
  expect(written[0] == 2 && read[0] == 1, "early: ... and the compute stream's write lands later");

  reset();
  fill<<<1, 64, 0, compute>>>(written, n, 2);
  cudaEventRecord(event, compute);
  cudaStreamWaitEvent(side, event, 0);
  copy_values<<<1, 64, 0, side>>>(written, read, n);
  expect(read[0] == 0, "early: a side stream that waits for unrun work stays queued");
  cudaStreamSynchronize(side);
  expect(read[0] == 2, "early: with the wait it copies the new value");

  reset();
  copy_values<<<1, 64, 0, side>>>(written, read, n);
  expect(read[0] == 1, "early: a side stream with nothing to wait for runs at the call");
  return mpt::cudaemu::check::report();
}

// The host-wait log (`cudaemu_selftest --wait-log PREFIX`, MPTRAIN_CUDAEMU_WAIT_LOG=PREFIX set
// before the first call): one line per host call that waits for work not run yet, naming the
// newest awaited item's queueing time, not the newest queued one; none for a call with nothing
// to wait for.
struct WaitLine {
  std::string call;
  int main_thread = 0;
  long long at = 0, queued = 0;
};
std::vector<WaitLine> read_wait_log(const std::string& prefix) {
  std::vector<WaitLine> lines;
  std::FILE* file = std::fopen((prefix + "." + std::to_string(getpid())).c_str(), "r");
  if (file == nullptr) return lines;
  char text[256];
  while (std::fgets(text, sizeof text, file) != nullptr) {
    if (text[0] == '#') continue;
    char call[64];
    long tid = 0;
    WaitLine line;
    if (std::sscanf(text, "%63s %ld %d %lld %lld", call, &tid, &line.main_thread, &line.at,
                    &line.queued) == 5) {
      line.call = call;
      lines.push_back(line);
    }
  }
  std::fclose(file);
  return lines;
}

long long now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int check_wait_log(const std::string& prefix) {
  OrderBuffers buffers;
  constexpr int n = OrderBuffers::n;
  cudaStream_t stream = nullptr;
  cudaStreamCreate(&stream);
  cudaDeviceSynchronize();  // the buffers' setup: whatever it logged is read past below
  const std::size_t setup_lines = read_wait_log(prefix).size();

  // Awaited: the first fill (queued in [t0, t1]), not the second, queued 20 ms later.
  const long long t0 = now_ns();
  fill<<<1, 64, 0, stream>>>(buffers.written, n, 2);
  cudaEventRecord(buffers.event, stream);
  const long long t1 = now_ns();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  fill<<<1, 64, 0, stream>>>(buffers.written, n, 3);
  const long long t2 = now_ns();
  cudaEventSynchronize(buffers.event);
  cudaEventSynchronize(buffers.event);  // done by now: no wait, no line
  std::thread([&] { cudaStreamSynchronize(stream); }).join();
  cudaStreamSynchronize(stream);  // nothing left: no line

  std::vector<WaitLine> lines = read_wait_log(prefix);
  lines.erase(lines.begin(), lines.begin() + static_cast<std::ptrdiff_t>(setup_lines));
  expect(lines.size() == 2, "wait log: 2 lines for 2 waits, none for 2 calls with nothing to "
                            "wait for (" + std::to_string(lines.size()) + ")");
  if (lines.size() == 2) {
    const WaitLine& event = lines[0];
    expect(event.call == "cudaEventSynchronize" && event.main_thread == 1,
           "wait log: the event's wait, on the main thread (" + event.call + ")");
    expect(event.queued >= t0 && event.queued <= t1 && event.at >= t2,
           "wait log: it waited for work queued before the event, not for the later fill");
    const WaitLine& stream_wait = lines[1];
    expect(stream_wait.call == "cudaStreamSynchronize" && stream_wait.main_thread == 0,
           "wait log: the stream's wait, on another thread (" + stream_wait.call + ")");
    expect(stream_wait.queued >= t1 && stream_wait.queued <= t2,
           "wait log: ... for the later fill");
  }
  cudaStreamDestroy(stream);

  // NVTX ranges (the emulator's static injection): a push and a pop line each, in order, on
  // the calling thread, the name to the end of the line.
  const long long r0 = now_ns();
  nvtxRangePushA("step 7");
  std::thread([] {
    nvtxRangePushA("elsewhere");
    nvtxRangePop();
  }).join();
  nvtxRangePushA("forward");
  nvtxRangePop();
  nvtxRangePop();
  const long long r1 = now_ns();
  std::vector<std::string> ranges;
  if (std::FILE* file = std::fopen((prefix + "." + std::to_string(getpid())).c_str(), "r")) {
    char text[256];
    while (std::fgets(text, sizeof text, file) != nullptr) {
      char call[64], name[128] = "";
      long tid = 0;
      int main_thread = -1;
      long long at = 0;
      if (std::strncmp(text, "nvtxRange", 9) != 0 ||
          std::sscanf(text, "%63s %ld %d %lld %127[^\n]", call, &tid, &main_thread, &at, name) < 4)
        continue;
      ranges.push_back(std::string(call) + (main_thread == 1 ? " main " : " other ") +
                       (at >= r0 && at <= r1 ? "" : "(time outside) ") + name);
    }
    std::fclose(file);
  }
  const std::vector<std::string> want = {
      "nvtxRangePushA main step 7",     "nvtxRangePushA other elsewhere", "nvtxRangePop other ",
      "nvtxRangePushA main forward",    "nvtxRangePop main ",             "nvtxRangePop main "};
  std::string got;
  for (const std::string& line : ranges) got += "[" + line + "] ";
  expect(ranges == want, "wait log: NVTX ranges pushed and popped in order, per thread, named (" +
                             got + ")");
  // The log is this run's alone (its name carries the pid): do not leave one per run behind.
  std::remove((prefix + "." + std::to_string(getpid())).c_str());
  return mpt::cudaemu::check::report();
}

}  // namespace

// A capture that forks: a second stream that waits for an event recorded in the capture joins
// it, its work replays in its place (after the fork, before the join), and an external record
// is a node that each launch records; a fork never joined back fails the capture; a captured
// stream's wait for an event recorded outside the capture, and a host wait for an event
// recorded in it, are refused. VALUES holds N >= 64 ints of device memory.
void check_forked_capture(int* values, int n) {
  cudaStream_t origin = nullptr, side = nullptr;
  cudaStreamCreate(&origin);
  cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
  cudaEvent_t fork = nullptr, join = nullptr, start = nullptr, end = nullptr;
  cudaEventCreateWithFlags(&fork, cudaEventDisableTiming);
  cudaEventCreateWithFlags(&join, cudaEventDisableTiming);
  cudaEventCreate(&start);
  cudaEventCreate(&end);
  int* const a = values;
  int* const b = values + 32;
  cudaMemset(values, 0, static_cast<std::size_t>(n) * sizeof(int));
  cudaStreamBeginCapture(origin, cudaStreamCaptureModeThreadLocal);
  fill<<<1, 32, 0, origin>>>(a, 32, 7);
  cudaEventRecord(fork, origin);
  cudaStreamWaitEvent(side, fork, 0);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(side, &status);
  expect(status == cudaStreamCaptureStatusActive, "fork: the stream that waited is capturing");
  cudaEventRecordWithFlags(start, side, cudaEventRecordExternal);
  copy_values<<<1, 32, 0, side>>>(a, b, 32);
  cudaEventRecordWithFlags(end, side, cudaEventRecordExternal);
  cudaEventRecord(join, side);
  cudaStreamWaitEvent(origin, join, 0);
  fill<<<1, 32, 0, origin>>>(a, 32, 9);
  cudaGraph_t graph = nullptr;
  expect(cudaStreamEndCapture(origin, &graph) == cudaSuccess && graph != nullptr,
         "fork and join: the capture ends");
  cudaStreamIsCapturing(side, &status);
  expect(status == cudaStreamCaptureStatusNone, "and the forked stream's capture with it");
  cudaGraphExec_t exec = nullptr;
  cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphLaunch(exec, origin);
  cudaStreamSynchronize(origin);
  int got[2] = {-1, -1};
  cudaMemcpy(&got[0], a, sizeof(int), cudaMemcpyDeviceToHost);
  cudaMemcpy(&got[1], b, sizeof(int), cudaMemcpyDeviceToHost);
  expect(got[0] == 9 && got[1] == 7,
         "the forked work replays between the fork and the join (" + std::to_string(got[0]) +
             ", " + std::to_string(got[1]) + ")");
  float ms = -1;
  expect(cudaEventElapsedTime(&ms, start, end) == cudaSuccess && ms >= 0,
         "external records: each launch records them");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);

  cudaStreamBeginCapture(origin, cudaStreamCaptureModeThreadLocal);
  cudaEventRecord(fork, origin);
  cudaStreamWaitEvent(side, fork, 0);
  add_one<<<1, 32, 0, side>>>(a, 32);
  graph = nullptr;
  expect(cudaStreamEndCapture(origin, &graph) == cudaErrorStreamCaptureUnjoined && graph == nullptr,
         "a fork never joined back: cudaErrorStreamCaptureUnjoined");
  cudaGetLastError();

  cudaStreamBeginCapture(origin, cudaStreamCaptureModeThreadLocal);
  cudaEventRecord(fork, origin);
  cudaStreamWaitEvent(side, fork, 0);
  add_one<<<1, 32, 0, side>>>(a, 32);
  cudaEventRecordWithFlags(end, side, cudaEventRecordExternal);
  cudaStreamWaitEvent(origin, end, 0);
  expect(cudaStreamEndCapture(origin, &graph) == cudaErrorStreamCaptureUnjoined,
         "a wait for an external record joins nothing: cudaErrorStreamCaptureUnjoined");
  cudaGetLastError();

  cudaEventRecord(fork, side);  // outside any capture
  cudaStreamBeginCapture(origin, cudaStreamCaptureModeThreadLocal);
  expect(cudaStreamWaitEvent(origin, fork, 0) == cudaErrorStreamCaptureIsolation,
         "a captured stream's wait for uncaptured work is refused");
  expect(cudaStreamEndCapture(origin, &graph) == cudaErrorStreamCaptureInvalidated,
         "and invalidates the capture");
  cudaGetLastError();

  cudaStreamBeginCapture(origin, cudaStreamCaptureModeThreadLocal);
  cudaEventRecord(fork, origin);
  expect(cudaEventQuery(fork) == cudaErrorStreamCaptureUnsupported,
         "a host query of an event recorded in the capture is refused");
  expect(cudaStreamEndCapture(origin, &graph) == cudaErrorStreamCaptureInvalidated,
         "and invalidates the capture");
  cudaGetLastError();
  for (cudaEvent_t event : {fork, join, start, end}) cudaEventDestroy(event);
  cudaStreamDestroy(side);
  cudaStreamDestroy(origin);
}

int main(int argc, char** argv) {
  setenv("MPTRAIN_CUDAEMU_DEVICES", "2", 1);  // two devices, for the cross-device checks
  if (argc > 2 && std::strcmp(argv[1], "--wait-log") == 0) {
    setenv("MPTRAIN_CUDAEMU_STREAMS", "deferred", 1);
    setenv("MPTRAIN_CUDAEMU_WAIT_LOG", argv[2], 1);
    return check_wait_log(argv[2]);
  }
  if (argc > 1 && std::strcmp(argv[1], "--early") == 0) {
    setenv("MPTRAIN_CUDAEMU_STREAMS", "early", 1);
    return check_early_streams();
  }
  setenv("MPTRAIN_CUDAEMU_STREAMS", "deferred", 1);  // the checks of stale reads need it
  constexpr int n = 10000, blocks = 7;
  std::vector<int> host(n);
  long long want = 0;
  for (int i = 0; i < n; ++i) want += host[i] = (i * 37) % 101 - 50;
  int *values = nullptr, *sums = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&values), n * sizeof(int));
  cudaMalloc(reinterpret_cast<void**>(&sums), blocks * sizeof(int));
  cudaMemcpy(values, host.data(), n * sizeof(int), cudaMemcpyHostToDevice);
  block_sums<<<blocks, 256>>>(values, n, sums);
  expect(cudaGetLastError() == cudaSuccess, "a launch of 7 blocks of 256");
  std::vector<int> got(blocks);
  cudaMemcpy(got.data(), sums, blocks * sizeof(int), cudaMemcpyDeviceToHost);
  long long total = 0;
  for (int s : got) total += s;
  expect(total == want, "barrier and shuffles: the blocks' sums add up to " + std::to_string(want) +
                            " (got " + std::to_string(total) + ")");

  block_sums<<<1, 2048>>>(values, n, sums);
  expect(cudaGetLastError() == cudaErrorInvalidConfiguration,
         "2048 threads per block: cudaErrorInvalidConfiguration");
  expect(cudaGetLastError() == cudaSuccess, "the launch error is read once");
  expect(cudaMemcpy(host.data(), values, 4, cudaMemcpyHostToDevice) == cudaErrorInvalidValue,
         "a host-to-device copy into host memory: cudaErrorInvalidValue");
  cudaGetLastError();

  expect_death("a barrier in divergent code",
               "left the kernel while the others wait at __syncthreads", [&] {
                 divergent_barrier<<<1, 64>>>(values);
                 cudaDeviceSynchronize();  // queued work runs (and faults) by then
               });
  expect_death("a shuffle whose mask names an exited lane", "left the kernel before a __shfl", [&] {
    shuffle_after_exit<<<1, 32>>>(values);
    cudaDeviceSynchronize();
  });
  expect_death("a kernel handed a host pointer", "points to host memory",
               [&] { add_one<<<1, 32>>>(host.data(), 4); });

  // Two devices: a stream and memory belong to the device current when they were made.
  cudaSetDevice(1);
  cudaStream_t stream_on_1 = nullptr;
  cudaStreamCreate(&stream_on_1);
  int* values_on_1 = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&values_on_1), 64 * sizeof(int));
  cudaSetDevice(0);
  add_one<<<1, 32, 0, stream_on_1>>>(values, 4);
  expect(cudaGetLastError() == cudaErrorInvalidResourceHandle,
         "a launch on device 1's stream from device 0: cudaErrorInvalidResourceHandle");
  cudaEvent_t event_on_0 = nullptr;
  cudaEventCreate(&event_on_0);
  expect(cudaEventRecord(event_on_0, stream_on_1) == cudaErrorInvalidResourceHandle,
         "device 0's event recorded on device 1's stream: cudaErrorInvalidResourceHandle");
  cudaGetLastError();
  cudaEventDestroy(event_on_0);
  expect_death("a kernel on device 0 handed device 1's memory", "points to memory of device 1",
               [&] { add_one<<<1, 32>>>(values_on_1, 4); });
  cudaSetDevice(1);
  add_one<<<1, 32, 0, stream_on_1>>>(values_on_1, 4);
  expect(cudaGetLastError() == cudaSuccess, "the same launch from device 1");
  cudaStreamDestroy(stream_on_1);
  cudaSetDevice(0);

  // Capture: recorded, not run; replayed with the parameters of the capture; a synchronous
  // copy on the capturing thread invalidates it.
  cudaStream_t stream = nullptr;
  cudaStreamCreate(&stream);
  cudaMemset(values, 0, n * sizeof(int));
  cudaGraph_t graph = nullptr;
  cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  int count = 100;
  add_one<<<2, 64, 0, stream>>>(values, count);
  count = 5;  // the graph keeps 100
  expect(cudaStreamEndCapture(stream, &graph) == cudaSuccess && graph != nullptr, "a capture ends");
  cudaGraphExec_t exec = nullptr;
  cudaGraphInstantiate(&exec, graph, 0);
  int first[2] = {-1, -1};
  cudaMemcpy(first, values, sizeof first, cudaMemcpyDeviceToHost);
  expect(first[0] == 0, "the capture ran nothing");
  for (int r = 0; r < 3; ++r) cudaGraphLaunch(exec, stream);
  int at[2] = {-1, -1};
  cudaMemcpy(&at[0], values + 99, sizeof(int), cudaMemcpyDeviceToHost);
  cudaMemcpy(&at[1], values + 100, sizeof(int), cudaMemcpyDeviceToHost);
  expect(at[0] == 3 && at[1] == 0, "3 replays with the captured count: element 99 is 3, 100 is 0");
  cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  add_one<<<1, 32, 0, stream>>>(values, count);
  expect(cudaMemcpy(first, values, sizeof first, cudaMemcpyDeviceToHost) ==
             cudaErrorStreamCaptureUnsupported,
         "a synchronous copy while capturing is refused");
  cudaGraph_t broken = nullptr;
  expect(cudaStreamEndCapture(stream, &broken) == cudaErrorStreamCaptureInvalidated &&
             broken == nullptr,
         "and the capture is invalidated");
  cudaGetLastError();
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  check_forked_capture(values, n);
  check_deferred_streams();
  return mpt::cudaemu::check::report();
}
