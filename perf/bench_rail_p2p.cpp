// What the cross-node phase of the hierarchical all-reduce could reach on one machine if it were
// mptrain's own instead of MPI_Allreduce on the rail (docs/perf.md, "Emulated nodes"): on 2
// ranks, in one run, interleaved per size,
//   direct   both ranks in one MPI-3 shared window; each sums its half straight out of both
//            buffers and writes the sum into both (what `hierarchical-shm-reg` does on one node),
//   p2p      a rail built on point-to-point messages: each rank sends the peer's half and
//            receives its own half of the peer's data in 256 KiB pieces (MPI_Sendrecv), adds
//            each piece while it is in cache, then the two halves' sums are exchanged,
//   mpi      MPI_Allreduce (what the rail calls today).
// Every result is checked. Prints busbw (= algbw on 2 ranks), the best of 5 interleaved rounds,
// per size and the ratios to direct.
//   mpiexec -n 2 build/release/perf/bench_rail_p2p [max MiB, default 64]
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

constexpr std::size_t kPiece = std::size_t{1} << 16;  // floats: 256 KiB per message

void fill(float* data, std::size_t n, int rank) {
  for (std::size_t i = 0; i < n; ++i) data[i] = static_cast<float>((i % 97) + rank);
}

// Elements that are not (i % 97) * 2 + 1, the sum of both ranks' fill().
std::size_t wrong(const float* data, std::size_t n) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += data[i] != static_cast<float>(2 * (i % 97) + 1);
  return bad;
}

void direct(float* mine, float* peer, std::size_t n, int rank, MPI_Win window) {
  const std::size_t half = n / 2, begin = rank == 0 ? 0 : half, end = rank == 0 ? half : n;
  MPI_Win_sync(window);
  MPI_Barrier(MPI_COMM_WORLD);
  for (std::size_t i = begin; i < end; ++i) peer[i] = mine[i] = mine[i] + peer[i];
  MPI_Win_sync(window);
  MPI_Barrier(MPI_COMM_WORLD);
}

void p2p(float* data, float* piece, std::size_t n, int rank) {
  const int peer = rank ^ 1;
  const std::size_t half = n / 2;
  float* own = rank == 0 ? data : data + half;
  float* other = rank == 0 ? data + half : data;
  const std::size_t own_n = rank == 0 ? half : n - half, other_n = n - own_n;
  for (std::size_t at = 0; at < std::max(own_n, other_n); at += kPiece) {
    const std::size_t send = at < other_n ? std::min(kPiece, other_n - at) : 0;
    const std::size_t recv = at < own_n ? std::min(kPiece, own_n - at) : 0;
    MPI_Sendrecv(other + at, static_cast<int>(send), MPI_FLOAT, peer, 0, piece,
                 static_cast<int>(recv), MPI_FLOAT, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    for (std::size_t i = 0; i < recv; ++i) own[at + i] += piece[i];
  }
  MPI_Sendrecv(own, static_cast<int>(own_n), MPI_FLOAT, peer, 1, other, static_cast<int>(other_n),
               MPI_FLOAT, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2) {
    if (rank == 0) std::fprintf(stderr, "bench_rail_p2p: run it on 2 ranks (mpiexec -n 2)\n");
    MPI_Finalize();
    return 2;
  }
  const std::size_t max_bytes = (argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 64) << 20;
  float* base = nullptr;
  MPI_Win window = MPI_WIN_NULL;
  MPI_Win_allocate_shared(static_cast<MPI_Aint>(max_bytes), sizeof(float), MPI_INFO_NULL,
                          MPI_COMM_WORLD, &base, &window);
  MPI_Aint peer_size = 0;
  int unit = 0;
  float* peer_base = nullptr;
  MPI_Win_shared_query(window, rank ^ 1, &peer_size, &unit, &peer_base);
  MPI_Win_lock_all(MPI_MODE_NOCHECK, window);
  std::vector<float> data(max_bytes / sizeof(float)), piece(kPiece);
  if (rank == 0)
    std::printf("%12s %10s %10s %10s %8s %8s %7s\n", "bytes", "direct", "p2p", "mpi", "p2p/dir",
                "mpi/dir", "#wrong");
  for (std::size_t bytes = std::size_t{1} << 20; bytes <= max_bytes; bytes *= 4) {
    const std::size_t n = bytes / sizeof(float);
    const int iterations = static_cast<int>(std::max<std::size_t>(5, (std::size_t{256} << 20) / bytes));
    double best[3] = {1e30, 1e30, 1e30};
    std::size_t bad = 0;
    for (int round = 0; round < 5; ++round) {
      for (int algo = 0; algo < 3; ++algo) {
        float* buffer = algo == 0 ? base : data.data();
        const auto once = [&] {
          if (algo == 0) direct(base, peer_base, n, rank, window);
          if (algo == 1) p2p(data.data(), piece.data(), n, rank);
          if (algo == 2)
            MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                          MPI_COMM_WORLD);
        };
        fill(buffer, n, rank);  // checked once per round and algorithm
        MPI_Win_sync(window);
        MPI_Barrier(MPI_COMM_WORLD);
        once();
        bad += wrong(buffer, n);
        MPI_Barrier(MPI_COMM_WORLD);
        const double start = MPI_Wtime();
        for (int i = 0; i < iterations; ++i) once();  // the sums grow: timing only
        double seconds = (MPI_Wtime() - start) / iterations;
        MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        best[algo] = std::min(best[algo], seconds);
      }
    }
    std::size_t all_bad = 0;
    MPI_Reduce(&bad, &all_bad, 1, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      const auto gbps = [&](double seconds) { return static_cast<double>(bytes) / seconds / 1e9; };
      std::printf("%12zu %10.2f %10.2f %10.2f %7.2fx %7.2fx %7zu\n", bytes, gbps(best[0]),
                  gbps(best[1]), gbps(best[2]), best[0] / best[1], best[0] / best[2], all_bad);
    }
  }
  MPI_Win_unlock_all(window);
  MPI_Win_free(&window);
  MPI_Finalize();
  return 0;
}
