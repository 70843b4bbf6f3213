// `mptrain bench allreduce`: the all-reduce algorithms swept over message sizes in the style of
// nccl-tests (time, algbw, busbw = algbw * 2(N-1)/N, #wrong), with the machine's memcpy
// bandwidth measured in the same run so that every figure has its ceiling beside it.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <vector>

#include "app/cli.hpp"
#include "comm/allreduce.hpp"
#include "comm/topology.hpp"
#include "core/error.hpp"
#include "core/half.hpp"
#include "core/json.hpp"

namespace mpt::app {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The checked iteration's input: small integers, so that every partial sum is exact in fp32,
// fp16 and bf16 alike and any wrong element is a real error, not rounding.
float pattern(std::int64_t i, int rank) { return static_cast<float>((i * 7 + rank * 3) % 5 - 2); }

void fill(void* data, std::int64_t count, DType dtype, int rank) {
  if (dtype == DType::f32) {
    auto* x = static_cast<float*>(data);
    for (std::int64_t i = 0; i < count; ++i) x[i] = pattern(i, rank);
    return;
  }
  auto* x = static_cast<std::uint16_t*>(data);
  const bool half = dtype == DType::f16;
  for (std::int64_t i = 0; i < count; ++i)
    x[i] = half ? float_to_half_bits(pattern(i, rank)) : float_to_bf16_bits(pattern(i, rank));
}

float element(const void* data, std::int64_t i, DType dtype) {
  if (dtype == DType::f32) return static_cast<const float*>(data)[i];
  const std::uint16_t bits = static_cast<const std::uint16_t*>(data)[i];
  return dtype == DType::f16 ? half_bits_to_float(bits) : bf16_bits_to_float(bits);
}

// Elements of DATA that differ from the exact sum over SIZE ranks.
std::int64_t count_wrong(const void* data, std::int64_t count, DType dtype, int size) {
  std::int64_t wrong = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    double expected = 0;
    for (int r = 0; r < size; ++r) expected += pattern(i, r);
    if (static_cast<double>(element(data, i, dtype)) != expected) ++wrong;
  }
  return wrong;
}

// Bytes per second of one memcpy of BYTES (the best of a few), on every rank that calls it.
double memcpy_bandwidth(std::int64_t bytes) {
  std::vector<char> source(static_cast<std::size_t>(bytes), 1), target(static_cast<std::size_t>(bytes), 0);
  double best = 1e30;
  for (int repeat = 0; repeat < 5; ++repeat) {
    const auto start = Clock::now();
    std::memcpy(target.data(), source.data(), source.size());
    best = std::min(best, seconds_since(start));
    source[static_cast<std::size_t>(repeat)] = target[static_cast<std::size_t>(bytes - 1 - repeat)];
  }
  return static_cast<double>(bytes) / best;
}

struct Row {
  std::int64_t bytes, count;
  std::string algo;
  double time_us, algbw, busbw;  // GB/s = 1e9 bytes/s, as nccl-tests
  std::int64_t wrong;
  int iters;
};

comm::AllreduceConfig config_for(const std::string& algo, DType dtype,
                                 const BenchCommand& command) {
  comm::AllreduceConfig config;
  config.shm_segment_bytes = command.shm_segment_bytes;
  config.rail_batch_bytes = command.rail_batch_bytes;
  config.algorithm = algo == "flat-mpi" ? comm::Algorithm::flat_mpi : comm::Algorithm::hierarchical;
  config.intra = algo == "hierarchical-mpi" ? comm::IntraBackend::mpi : comm::IntraBackend::shm;
  config.wire = dtype;
  return config;
}

}  // namespace

int run_bench(const BenchCommand& command, const comm::World& world) {
  const DType dtype = dtype_from_name(command.dtype, "--dtype");
  const std::int64_t element_size = static_cast<std::int64_t>(dtype_size(dtype));
  // One topology per ranks-per-node in use (-K's, and any ALGO@K's), built collectively in the
  // order of first use, the same on every rank.
  std::map<int, std::unique_ptr<comm::Topology>> topologies;
  for (const int k : command.algo_ranks_per_node)
    if (!topologies.count(k)) topologies[k] = std::make_unique<comm::Topology>(world.handle(), k);
  if (!topologies.count(command.ranks_per_node))
    topologies[command.ranks_per_node] =
        std::make_unique<comm::Topology>(world.handle(), command.ranks_per_node);
  const comm::Topology& topology = *topologies.at(command.ranks_per_node);
  const int size = topology.size();
  const bool root = topology.rank() == 0;
  world.run_agreed([&] {
    for (std::size_t a = 0; a < command.algos.size(); ++a)
      MPT_REQUIRE(command.algos[a].rfind("hierarchical-shm", 0) != 0 ||
                      topologies.at(command.algo_ranks_per_node[a])->shm_capable(),
                  "--algos (-a) " + command.algos[a] +
                      ": the ranks of an emulated node do not share memory",
                  "choose ranks per node (-K, or @K) so that each group lies on one host, or use "
                  "hierarchical-mpi");
  });

  // Memory bandwidth, measured in this run: rank 0 alone (a single core's memcpy, the figure
  // the issue quotes), then every rank at once (the ranks share the memory system).
  world.barrier();
  const double memcpy_alone = root ? memcpy_bandwidth(command.memcpy_bytes) : 0;
  world.barrier();
  // The slowest rank's: the minimum, as a maximum of negated values (World has no min).
  const double memcpy_all = -world.max(-memcpy_bandwidth(command.memcpy_bytes));

  std::vector<std::int64_t> sizes;
  for (double bytes = static_cast<double>(command.min_bytes); bytes <= static_cast<double>(command.max_bytes);
       bytes *= command.step_factor) {
    const std::int64_t rounded = static_cast<std::int64_t>(bytes) / element_size * element_size;
    if (sizes.empty() || rounded != sizes.back()) sizes.push_back(rounded);
  }
  const std::int64_t max_count = command.max_bytes / element_size;
  Tensor buffer({std::max<std::int64_t>(max_count, 1)}, dtype);
  // hierarchical-shm-reg: the data lies in a buffer in the node's shared window, registered with
  // the algorithm's Allreducers, so the sums read the peers' data where it is (as nccl-tests -R
  // measures NCCL's registered user buffers). One per such entry, over its topology.
  std::vector<std::shared_ptr<comm::SharedBuffer>> shared(command.algos.size());
  const auto registered = [&](std::size_t a) {
    return command.algos[a].substr(0, command.algos[a].find('@')) == "hierarchical-shm-reg";
  };
  const std::size_t buffer_bytes = std::max<std::size_t>(buffer.size_bytes(), 64);
  world.run_agreed([&] {
    for (std::size_t a = 0; a < command.algos.size(); ++a) {
      std::string why;
      MPT_REQUIRE(!registered(a) || comm::SharedBuffer::fits(
                                        *topologies.at(command.algo_ranks_per_node[a]),
                                        buffer_bytes, &why),
                  "--algos (-a) " + command.algos[a] + ": no room for a " +
                      std::to_string(buffer_bytes >> 20) + " MiB buffer per rank: " + why,
                  "lower --max-bytes (-e), or drop hierarchical-shm-reg");
    }
  });
  for (std::size_t a = 0; a < command.algos.size(); ++a)
    if (registered(a))
      shared[a] = std::make_shared<comm::SharedBuffer>(
          *topologies.at(command.algo_ranks_per_node[a]), buffer_bytes);
  const auto data_of = [&](std::size_t a) -> void* {
    return shared[a] ? static_cast<void*>(shared[a]->data()) : buffer.raw();
  };

  if (root) {
    std::printf("# mptrain bench allreduce: %d rank(s), %d node(s) (ranks per node %s), dtype %s, "
                "%d interleaved rounds of up to %d iterations or %.2g s per row (the median round), %d warmup\n",
                size, topology.num_nodes(),
                command.ranks_per_node > 0 ? std::to_string(command.ranks_per_node).c_str() : "from MPI",
                command.dtype.c_str(), command.rounds, command.iters, command.row_seconds, command.warmup_iters);
    std::printf("# memcpy %lld bytes: %.2f GB/s on rank 0 alone, %.2f GB/s per rank with all ranks at once\n",
                static_cast<long long>(command.memcpy_bytes), memcpy_alone / 1e9, memcpy_all / 1e9);
    std::printf("# timed iterations average (sum x 1/N in the last pass); the checked one sums exactly\n#\n");
    std::printf("# %12s %12s %6s %18s %10s %12s %12s %8s\n", "size", "count", "type", "algo",
                "time_us", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
    std::fflush(stdout);
  }

  std::vector<Row> rows;
  const double bus_factor = size > 1 ? 2.0 * (size - 1) / size : 0.0;
  // One summing (checked) and one averaging (timed) Allreducer per algorithm, built up front so
  // that every size can measure the algorithms side by side.
  std::vector<std::unique_ptr<comm::Allreducer>> sums, averages;
  for (std::size_t a = 0; a < command.algos.size(); ++a) {
    const std::string& entry = command.algos[a];
    const comm::Topology& nodes = *topologies.at(command.algo_ranks_per_node[a]);
    comm::AllreduceConfig checked = config_for(entry.substr(0, entry.find('@')), dtype, command);
    comm::AllreduceConfig timed = checked;
    timed.postscale = 1.0f / static_cast<float>(size);
    sums.push_back(std::make_unique<comm::Allreducer>(nodes, checked));
    averages.push_back(std::make_unique<comm::Allreducer>(nodes, timed));
    if (shared[a]) {
      sums.back()->register_buffer(shared[a]);
      averages.back()->register_buffer(shared[a]);
    }
  }
  const std::size_t num_algos = command.algos.size();
  const int rounds = command.rounds;
  for (const std::int64_t bytes : sizes) {
    const std::int64_t count = bytes / element_size;
    std::vector<std::int64_t> wrong(num_algos, 0);
    std::vector<int> iters(num_algos, 1);
    for (std::size_t a = 0; a < num_algos; ++a) {
      void* data = data_of(a);
      if (command.check) {
        fill(data, count, dtype, topology.rank());
        sums[a]->allreduce(data, count, dtype);
        wrong[a] = count_wrong(data, count, dtype, size);
        MPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &wrong[a], 1, MPI_INT64_T, MPI_SUM, world.handle()));
      }
      fill(data, count, dtype, topology.rank());
      // Warm-up, and an estimate of one iteration that every rank agrees on (the slowest's).
      double estimate = 0;
      for (int i = 0; i < std::max(1, command.warmup_iters); ++i) {
        const auto start = Clock::now();
        averages[a]->allreduce(data, count, dtype);
        estimate = std::max(estimate, seconds_since(start));
      }
      estimate = world.max(estimate);
      iters[a] = static_cast<int>(std::clamp(command.row_seconds / rounds / std::max(estimate, 1e-9), 1.0,
                                             static_cast<double>(command.iters)));
    }
    // Rounds interleave the algorithms, so a burst of load from elsewhere on a shared machine
    // hits them alike; each row reports the median round (the slowest rank's time per iteration).
    std::vector<std::vector<double>> round_seconds(num_algos);
    for (int round = 0; round < rounds; ++round) {
      for (std::size_t a = 0; a < num_algos; ++a) {
        world.barrier();
        const auto start = Clock::now();
        for (int i = 0; i < iters[a]; ++i) averages[a]->allreduce(data_of(a), count, dtype);
        round_seconds[a].push_back(world.max(seconds_since(start) / iters[a]));
      }
    }
    for (std::size_t a = 0; a < num_algos; ++a) {
      auto& times = round_seconds[a];
      std::sort(times.begin(), times.end());
      const double seconds = times[times.size() / 2];
      Row row{bytes, count, command.algos[a], seconds * 1e6, 0, 0, wrong[a], iters[a] * rounds};
      row.algbw = seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0;
      row.busbw = row.algbw * bus_factor;
      rows.push_back(row);
      if (root) {
        std::printf("  %12lld %12lld %6s %18s %10.1f %12.3f %12.3f %8lld\n", static_cast<long long>(bytes),
                    static_cast<long long>(count), command.dtype.c_str(), row.algo.c_str(), row.time_us,
                    row.algbw, row.busbw, static_cast<long long>(row.wrong));
        std::fflush(stdout);
      }
    }
  }

  std::int64_t total_wrong = 0;
  std::map<std::string, std::pair<double, int>> busbw_sums;
  for (const auto& row : rows) {
    total_wrong += row.wrong;
    busbw_sums[row.algo].first += row.busbw;
    busbw_sums[row.algo].second += 1;
  }
  if (root) {
    std::printf("# Out of bounds values : %lld %s\n", static_cast<long long>(total_wrong), total_wrong ? "FAILED" : "OK");
    for (const auto& algo : command.algos)
      std::printf("# Avg bus bandwidth    : %.4f GB/s  %s\n",
                  busbw_sums[algo].first / std::max(1, busbw_sums[algo].second), algo.c_str());
    std::fflush(stdout);
  }
  world.run_agreed([&] {
    if (!root || command.json_path.empty()) return;
    std::string array = "[";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& row = rows[i];
      JsonObject json;
      json.add("size", row.bytes).add("count", row.count).add("type", command.dtype).add("algo", row.algo)
          .add("time_us", row.time_us).add("algbw", row.algbw).add("busbw", row.busbw)
          .add("wrong", row.wrong).add("iters", row.iters)
          .add("busbw_over_memcpy", memcpy_alone > 0 ? row.busbw * 1e9 / memcpy_alone : 0.0);
      if (i > 0) array += ',';
      array += json.str();
    }
    array += "]";
    JsonObject json;
    json.add("ranks", size).add("nodes", topology.num_nodes()).add("ranks_per_node", command.ranks_per_node)
        .add("type", command.dtype).add("memcpy_bytes", command.memcpy_bytes)
        .add("memcpy_gbps_alone", memcpy_alone / 1e9).add("memcpy_gbps_all_ranks", memcpy_all / 1e9)
        .add_raw("rows", array);
    std::ofstream out(command.json_path);
    MPT_REQUIRE(static_cast<bool>(out), "cannot write --json file '" + command.json_path + "'",
                "check that its directory exists and is writable");
    out << json.str() << "\n";
    MPT_REQUIRE(static_cast<bool>(out.flush()), "cannot write --json file '" + command.json_path + "'",
                "check the free space on its file system");
  });
  return total_wrong ? 1 : 0;
}

}  // namespace mpt::app
