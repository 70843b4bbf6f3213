// Raw reader throughput: one epoch of DatasetReader::read_batch over a data file in the order of
// a ShardPlan (shuffle none, window or global), in file bytes per second, conversion to f32
// included. perf/bench_reader.sh runs it beside `cat` and h5py reading the same hyperslabs.
//
//   bench_reader FILE --shuffle none|window|global [--batch 256] [--window 65536] [--reps 3]
//                [--direct 1|0] [--dump-order PATH] [--raw 1]
// prints one line: mode, batch, samples, seconds (best of reps), MB/s, samples/s. --raw 1 times
// the I/O part alone (detail::DataFile::read of each batch's sorted runs into a staging buffer,
// no conversion), which is what `cat` does too.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "core/error.hpp"
#include "data/data.hpp"
#include "data/internal.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int code = 0;
  try {
    if (argc < 2) {
      std::fprintf(stderr, "usage: bench_reader FILE --shuffle none|window|global [--batch B] "
                           "[--window W] [--reps R] [--direct 1|0] [--dump-order PATH]\n");
      MPI_Finalize();
      return 2;
    }
    const std::string path = argv[1];
    std::string shuffle = "none", dump;
    std::int64_t batch = 256, window = 65536;
    int reps = 3;
    bool direct = true, raw = false;
    for (int i = 2; i + 1 < argc; i += 2) {
      const std::string key = argv[i], value = argv[i + 1];
      if (key == "--shuffle") shuffle = value;
      else if (key == "--batch") batch = std::stoll(value);
      else if (key == "--window") window = std::stoll(value);
      else if (key == "--reps") reps = std::stoi(value);
      else if (key == "--direct") direct = value != "0";
      else if (key == "--dump-order") dump = value;
      else if (key == "--raw") raw = value != "0";
      else mpt::throw_user_error("unknown option " + key, "see the usage line");
    }
    mpt::data::ReaderOptions reader_options;
    reader_options.direct_reads = direct;
    mpt::data::DatasetReader reader(path, reader_options);
    const auto& info = reader.info();
    mpt::data::ShardOptions shard_options;
    shard_options.shuffle = mpt::data::parse_shuffle_mode(shuffle);
    shard_options.shuffle_window = window;
    mpt::data::ShardPlan plan(info.num_samples, batch, 1, 0, 42, shard_options);
    if (!dump.empty()) {  // the epoch's batches, for the h5py peer to read the same hyperslabs
      std::ofstream out(dump, std::ios::binary);
      std::vector<std::int64_t> indices;
      for (std::int64_t step = 0; step < plan.steps_per_epoch(); ++step) {
        plan.batch_indices(0, step, indices);
        out.write(reinterpret_cast<const char*>(indices.data()),
                  static_cast<std::streamsize>(indices.size() * sizeof(std::int64_t)));
      }
    }
    mpt::Shape shape{batch};
    shape.insert(shape.end(), info.sample_shape.begin(), info.sample_shape.end());
    mpt::Tensor samples(shape, mpt::DType::f32);
    mpt::Tensor labels({batch}, mpt::DType::i32);
    std::vector<std::int64_t> indices;
    const std::int64_t sample_file_bytes =
        mpt::shape_numel(info.sample_shape) *
        static_cast<std::int64_t>(mpt::dtype_size(info.sample_dtype));
    // For --raw: the single file read directly, and a staging buffer of one batch.
    std::unique_ptr<mpt::data::detail::DataFile> raw_file;
    if (raw) raw_file = std::make_unique<mpt::data::detail::DataFile>(info.files.at(0), reader_options);
    std::vector<std::byte> staging(static_cast<std::size_t>(batch * sample_file_bytes));
    double best = 1e30;
    for (int rep = 0; rep < reps; ++rep) {
      const auto start = std::chrono::steady_clock::now();
      if (raw) {
        for (std::int64_t step = 0; step < plan.steps_per_epoch(); ++step) {
          plan.batch_indices(0, step, indices);
          std::sort(indices.begin(), indices.end());
          std::size_t begin = 0;
          for (std::size_t i = 1; i <= indices.size(); ++i) {
            if (i < indices.size() && indices[i] == indices[i - 1] + 1) continue;
            raw_file->read(indices[begin], static_cast<std::int64_t>(i - begin),
                           staging.data() + begin * static_cast<std::size_t>(sample_file_bytes));
            begin = i;
          }
        }
      } else {
        for (std::int64_t step = 0; step < plan.steps_per_epoch(); ++step) {
          plan.batch_indices(0, step, indices);
          reader.read_batch(indices, samples, labels);
        }
      }
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    const double n = static_cast<double>(plan.steps_per_epoch() * batch);
    std::printf("mptrain %-6s %s direct=%d batch %lld: %.0f samples in %.3f s = %.1f MB/s, %.0f samples/s\n",
                shuffle.c_str(), raw ? "read only " : "read_batch", direct ? 1 : 0, static_cast<long long>(batch), n, best,
                n * static_cast<double>(sample_file_bytes) / best / 1e6, n / best);
  } catch (const mpt::UserError& error) {
    std::fprintf(stderr, "bench_reader: %s (hint: %s)\n", error.what(), error.hint().c_str());
    code = 2;
  }
  MPI_Finalize();
  return code;
}
