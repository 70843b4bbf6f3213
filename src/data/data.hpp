// The data module: preparing HDF5 data files (Fashion-MNIST from IDX, synthetic), reading random
// batches from them, and deciding which rank reads which samples. The file layout is specified
// in docs/data-format.md.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/device_memory.hpp"
#include "core/hdf5.hpp"
#include "core/tensor.hpp"

namespace mpt::data {

// ---- preparing data files ----------------------------------------------------------------------

// Writes OUT_DIR/train.h5 and OUT_DIR/test.h5 (creating OUT_DIR) from the four IDX files of
// Fashion-MNIST in SOURCE_DIR (gzip, or uncompressed without the .gz suffix). Debian's
// dataset-fashion-mnist package installs them in /usr/share/datasets/fashion-mnist. mean and std
// come from the training set and are written to both files.
void prepare_fashion_mnist(const std::string& source_dir, const std::string& out_dir);

struct IdxConvertOptions {
  int num_classes = 10;
  std::string class_names;  // comma separated; empty = none written
  std::string source;       // free text stored in the 'source' attribute
  // Normalisation written to the file, for pixel values scaled to [0, 1]. NaN means: compute it
  // from this file's pixels (what the training set does; the test set reuses the result).
  float mean = std::numeric_limits<float>::quiet_NaN();
  float std = std::numeric_limits<float>::quiet_NaN();
};

// Converts one pair of IDX files (images: magic 0x00000803, labels: 0x00000801; gzip or raw) to
// an mptrain data file at OUT_PATH. Throws UserError naming the file for a missing, truncated or
// malformed input, a count mismatch or a label >= num_classes.
void convert_idx(const std::string& images_path, const std::string& labels_path,
                 const std::string& out_path, const IdxConvertOptions& options);

// A learnable synthetic data set: each class has a fixed random uint8 prototype, and each sample
// is its class prototype blended with per-sample noise. Everything is a pure function of the
// seed, so any rank can regenerate it; written in slabs, so N may be in the millions.
struct SyntheticSpec {
  std::int64_t train_samples = 8192;
  std::int64_t test_samples = 2048;
  Shape sample_shape{1, 28, 28};
  int num_classes = 10;
  std::uint64_t seed = 1;
  float noise = 0.35f;  // weight of the noise in the blend, in [0, 1]
  // Stored dtype: u8 pixels, or f32/f16 holding pixel / 255 (in [0, 1], used as they are).
  DType dtype = DType::u8;
};

// Writes OUT_DIR/train.h5 and OUT_DIR/test.h5 (creating OUT_DIR).
void prepare_synthetic(const SyntheticSpec& spec, const std::string& out_dir);

// Options of the array converters (`mptrain prepare npy` and `csv`), which write one data file.
struct ArrayConvertOptions {
  std::int64_t num_classes = 0;  // 0: the largest label + 1
  Shape sample_shape;            // empty: as stored (npy) or (D) (csv); else a reshape of it
  // uint8 data: a data file whose mean and std are copied (the training set's, when converting a
  // test set). Empty: computed from the pixels being converted.
  std::string stats_from;
  // csv only.
  std::int64_t label_column = 0;  // 0-based; negative counts from the end (-1: last)
  std::string header = "auto";    // auto (a first row with a non-number is a header) | yes | no
};

// Converts a pair of .npy files (format 1.0/2.0/3.0, C order, little-endian): SAMPLES_PATH of
// dtype |u1 (uint8), <f2 or <f4 and shape (N, ...) with rank >= 2, and LABELS_PATH of integer
// dtype (|u1, <i2, <i4, <i8, ...) and shape (N,). Writes OUT_PATH in the documented layout,
// streaming the samples in slabs. UserError naming the file for anything malformed.
void convert_npy(const std::string& samples_path, const std::string& labels_path,
                 const std::string& out_path, const ArrayConvertOptions& options);

// Converts a CSV file, one sample per line: the label in column options.label_column and the
// features in all other columns, comma separated. Samples are uint8 if every feature is an
// integer in [0, 255], float32 otherwise. Reads the file twice (check, then write), so memory
// stays bounded. UserError naming the file, line and column for anything malformed.
void convert_csv(const std::string& csv_path, const std::string& out_path,
                 const ArrayConvertOptions& options);

// ---- reading ----------------------------------------------------------------------------------

struct DatasetInfo {
  std::string path;  // the files, comma separated when there are several (globs expanded)
  std::vector<std::string> files;
  std::int64_t num_samples = 0;  // all files together
  Shape sample_shape;              // without the leading N
  DType sample_dtype = DType::u8;  // as stored: u8, f32 or f16
  int num_classes = 0;
  float mean = 0.0f;  // of the [0,1]-scaled values; used for uint8 samples only
  float std = 1.0f;
  std::string samples_name;
  std::string labels_name;
};

// uint8 samples become x * scale + shift, which is (x/255 - mean)/std as one multiply-add. The
// reader applies it on its I/O thread; a run that ships the stored bytes to the device
// (Prefetcher::deliver_to with raw_u8) applies it there, with these same two floats
// (kernels::normalize_u8).
struct U8Normalization {
  float scale = 1.0f;
  float shift = 0.0f;
};
U8Normalization u8_normalization(const DatasetInfo& info);

class SampleCache;
namespace detail {
class DataFile;
}

// What read_batch does with a float sample holding NaN or infinity (--data.on-nonfinite).
enum class NonFiniteAction {
  error,  // UserError naming the file, dataset and the sample's index (the default)
  skip,   // the sample's row is zeroed and its label set to -1 (kernels::kIgnoreLabel), counted
};
NonFiniteAction parse_nonfinite_action(const std::string& text);  // UserError naming the option

// The data files PATH names: one file, a comma-separated list, or glob(3) patterns (each
// expanded and sorted), in order. UserError naming OPTION when a pattern matches nothing.
std::vector<std::string> expand_data_paths(const std::string& path, const std::string& option);

struct ReaderOptions {
  // Empty: the file's samples_dataset / labels_dataset attribute, else "samples" / "labels".
  std::string samples_name;
  std::string labels_name;
  std::size_t chunk_cache_bytes = 64u << 20;   // HDF5 chunk cache of the samples dataset
  std::string option_prefix = "--data.train";  // the option that named the file, for messages
  // Used where the file lacks the attribute (--data.num-classes, --data.mean, --data.std,
  // --data.sample-shape). Where both exist they must agree. 0, NaN and empty mean "not given".
  std::int64_t num_classes = 0;
  float mean = std::numeric_limits<float>::quiet_NaN();  // of pixels scaled to [0, 1]
  float std = std::numeric_limits<float>::quiet_NaN();
  Shape sample_shape;  // a reshape of the stored sample (same number of elements)
  NonFiniteAction on_nonfinite = NonFiniteAction::error;
  // pread() runs of samples straight into the staging buffer, past HDF5, where the bytes on
  // disk are the staged bytes (uncompressed uint8 or native float32). Off: always H5Dread.
  bool direct_reads = true;
};

// Reads batches of samples by global index from a dataset of one or more data files, which act
// as one: global index i is sample i - offset_f of the file f whose range holds it, the files'
// ranges following each other in the order of PATH. Not for concurrent use by two threads (it
// owns scratch buffers); any number of readers may exist, since every HDF5 call goes through
// hdf5_lock().
class DatasetReader {
 public:
  // Opens and validates every file of PATH (see expand_data_paths) completely (layout, dtype,
  // attributes, every label in range, agreement between files); throws UserError naming the
  // file, the dataset and the option for anything wrong.
  DatasetReader(const std::string& path, const ReaderOptions& options);
  ~DatasetReader();
  DatasetReader(const DatasetReader&) = delete;
  DatasetReader& operator=(const DatasetReader&) = delete;

  const DatasetInfo& info() const { return info_; }

  // Reads the samples INDICES (any order, duplicates allowed, each in [0, N)) into rows
  // 0..indices.size()-1 of SAMPLES (f32 [n, sample_shape...], n >= indices.size(), caller-owned)
  // and their labels into LABELS (i32 [n]). uint8 samples become (x/255 - mean)/std
  // (u8_normalization); float samples are copied and must be finite (see NonFiniteAction).
  // Where the data are uint8, SAMPLES may be u8 instead: the stored bytes are copied as they
  // are, for a consumer that normalises them itself. Indices are sorted and
  // consecutive ones coalesced into one read each (split where one file ends); no allocation
  // once the scratch buffers have grown to the largest batch.
  void read_batch(std::span<const std::int64_t> indices, Tensor& samples, Tensor& labels);

  // --data.cache=memory: read_batch takes samples found in CACHE from memory and stores every
  // sample it reads from the file there. CACHE (not owned) may be shared by several readers of
  // the same file and must outlive this reader; nullptr turns caching off.
  void set_cache(SampleCache* cache) { cache_ = cache; }
  // Bytes one sample takes as staged for conversion: 1 per element for uint8, 4 for float.
  std::size_t staged_sample_bytes() const { return sample_bytes_; }
  // H5Dread calls of samples so far (tests check that a warm cache reads no file).
  std::int64_t file_reads() const { return file_reads_; }
  // Samples read so far that held NaN or infinity and were skipped (on_nonfinite = skip);
  // a sample read in several epochs counts each time.
  std::int64_t skipped_nonfinite() const { return skipped_nonfinite_; }
  // Samples read past HDF5 with pread() so far, and with H5Dread (tests and benchmarks).
  std::int64_t direct_samples_read() const;
  std::int64_t hdf5_samples_read() const;

 private:
  void open_and_validate(const ReaderOptions& options);
  // Reads global samples [BEGIN, BEGIN + COUNT) into OUT, one read per file it spans.
  void read_range(std::int64_t begin, std::int64_t count, std::byte* out);

  DatasetInfo info_;
  std::string option_prefix_;
  NonFiniteAction on_nonfinite_ = NonFiniteAction::error;
  std::vector<std::unique_ptr<detail::DataFile>> files_;
  std::vector<std::int64_t> file_begin_;  // global index of each file's sample 0, then N
  std::int64_t skipped_nonfinite_ = 0;
  std::int64_t sample_elements_ = 0;
  std::size_t sample_bytes_ = 0;  // per sample in the staging buffer
  float scale_ = 1.0f;            // uint8 -> f32: x * scale_ + shift_
  float shift_ = 0.0f;
  std::vector<std::int32_t> labels_;  // all of them, every file's, read and validated at open
  // Scratch, grown on first use and then reused.
  struct Run {
    std::int64_t begin;  // first sample index of consecutive indices
    std::int64_t length;
    std::int64_t first_slot;  // where its samples land in staging_
  };
  std::vector<Run> runs_;
  std::vector<std::pair<std::int64_t, std::int64_t>> sorted_;  // (index, batch position)
  std::vector<std::int64_t> slot_of_position_;                 // batch position -> staging slot
  std::vector<std::byte> staging_;
  SampleCache* cache_ = nullptr;
  std::int64_t file_reads_ = 0;
};

// ---- sharding ---------------------------------------------------------------------------------

// How an epoch orders the samples before it is cut into batches (--data.shuffle).
enum class ShuffleMode {
  global,  // one Fisher-Yates permutation of all N samples (the default)
  window,  // shuffle inside fixed windows of samples, and shuffle the order of the windows
  none,    // file order, 0..N-1, every epoch
};
// Parses "global" | "window" | "none"; UserError naming --data.shuffle otherwise.
ShuffleMode parse_shuffle_mode(const std::string& text);
const char* shuffle_mode_name(ShuffleMode mode);

struct ShardOptions {
  ShuffleMode shuffle = ShuffleMode::global;
  std::int64_t shuffle_window = 65536;  // samples per window (1..2^32), for ShuffleMode::window
  bool drop_last = true;                // false: pad the last global batch by wrapping around
  // What the samples are, for messages ("training set 'a.h5' (dataset 'samples')").
  std::string data_description = "the training set";
};

// Which global sample indices rank RANK of WORLD_SIZE reads at each step. Epoch e's order is the
// permutation P_e = epoch_order(n, seed, e, options); the global batch of step s is the positions
// [s*G, (s+1)*G) of it, with G = batch_per_rank * world_size, and rank r takes positions
// s*G + r*B + j, j < B. The union over ranks is therefore exactly what a 1-rank run with batch
// G reads, which is what makes runs on different world sizes train identically.
// With drop_last (the default) steps_per_epoch = floor(n / G) and the last n mod G positions of
// P_e are not read that epoch. Without it steps_per_epoch = ceil(n / G), and position p >= n
// reads P_e[p - n]: the last global batch is padded with the start of the same epoch's order.
class ShardPlan {
 public:
  // Throws UserError (naming --train.batch-size and the data) when the global batch exceeds
  // NUM_SAMPLES, and (naming --data.shuffle-window) for a window below 1.
  ShardPlan(std::int64_t num_samples, std::int64_t batch_per_rank, int world_size, int rank,
            std::uint64_t seed, const ShardOptions& options = {});

  std::int64_t steps_per_epoch() const { return steps_per_epoch_; }
  std::int64_t global_batch() const { return batch_per_rank_ * world_size_; }
  std::int64_t batch_per_rank() const { return batch_per_rank_; }
  const ShardOptions& options() const { return options_; }

  // This rank's batch_per_rank indices for STEP (0 <= step < steps_per_epoch) of EPOCH, into OUT
  // (resized). The epoch's order is computed once and cached, so this is not thread-safe.
  void batch_indices(std::int64_t epoch, std::int64_t step, std::vector<std::int64_t>& out) const;

  // The order of epoch EPOCH, a permutation of 0..n-1, for any shuffle mode:
  //  - global: epoch_permutation(n, seed, epoch).
  //  - none: 0, 1, ..., n-1.
  //  - window (W = options.shuffle_window): the windows are [k*W, min((k+1)*W, n)),
  //    k < K = ceil(n / W). Their order is the Fisher-Yates permutation Q of 0..K-1 driven by
  //    CounterRng(seed, 0x57494E444F57 ^ epoch) ("WINDOW"). The order is Q[0]'s window, then
  //    Q[1]'s, ...; the samples of window k, at local positions 0..m-1, are shuffled by the same
  //    Fisher-Yates loop, its draw for i being CounterRng(seed, 0x57534855464C ^ epoch)
  //    ("WSHUFL").below(k * 2^32 + i, i + 1). Every batch then lies inside one window (or two,
  //    where windows meet), so a large file is read one W-sample region at a time.
  static std::vector<std::int64_t> epoch_order(std::int64_t n, std::uint64_t seed,
                                               std::int64_t epoch, const ShardOptions& options);

  // Fisher-Yates: p = 0..n-1; for i = n-1 down to 1: swap(p[i], p[below_i(i+1)]) where below_i is
  // CounterRng(seed, 0x5348554646 ^ epoch).below(i, i + 1).
  static std::vector<std::int64_t> epoch_permutation(std::int64_t n, std::uint64_t seed,
                                                     std::int64_t epoch);

 private:
  std::int64_t num_samples_;
  std::int64_t batch_per_rank_;
  int world_size_;
  int rank_;
  std::uint64_t seed_;
  ShardOptions options_;
  std::int64_t steps_per_epoch_;
  mutable std::int64_t cached_epoch_ = -1;
  mutable std::vector<std::int64_t> permutation_;
};

// Rank RANK's contiguous range [begin, end) of an evaluation set of N samples: the ranges cover
// all N with no drop and differ in size by at most one.
std::pair<std::int64_t, std::int64_t> eval_shard(std::int64_t n, int world_size, int rank);

// ---- prefetching ------------------------------------------------------------------------------

// --data.cache=memory: the staged bytes of every sample read so far, so that a sample is read
// from the file once per run and then from memory. Planned at setup as one buffer for the whole
// dataset: with global shuffling a rank's shard differs every epoch, so after a few epochs the
// cache holds most of the file. Pages are committed by the kernel only as samples arrive.
// Thread-safe: any number of readers (I/O threads) may look up and insert at once.
class SampleCache {
 public:
  // Plans room for all NUM_SAMPLES samples of SAMPLE_BYTES each. Throws UserError naming
  // --data.cache when that exceeds LIMIT_BYTES; LIMIT_TEXT says where the limit came from.
  SampleCache(std::int64_t num_samples, std::size_t sample_bytes, std::size_t limit_bytes,
              const std::string& limit_text, const std::string& path);

  // Copies sample INDEX into DESTINATION (sample_bytes) if present; false if not (yet).
  bool lookup(std::int64_t index, std::byte* destination) const;
  // Stores sample INDEX from SOURCE unless it is present or another thread is storing it.
  void insert(std::int64_t index, const std::byte* source);

  std::size_t planned_bytes() const { return sample_bytes_ * static_cast<std::size_t>(num_samples_); }
  std::int64_t cached_samples() const { return cached_.load(std::memory_order_relaxed); }

 private:
  enum State : std::uint8_t { kAbsent, kFilling, kPresent };
  std::int64_t num_samples_;
  std::size_t sample_bytes_;
  std::unique_ptr<std::byte[]> bytes_;  // uninitialised on purpose: untouched pages cost nothing
  std::unique_ptr<std::atomic<std::uint8_t>[]> state_;
  std::atomic<std::int64_t> cached_{0};
};

// Memory this rank may use for --data.cache: MemAvailable from /proc/meminfo (or sysconf's
// available pages) divided by RANKS_PER_NODE, in bytes.
std::size_t available_memory_per_rank(int ranks_per_node);

// One batch of the ring: host tensors planned at construction. A prefetcher that delivers to
// the cuda device (Prefetcher::deliver_to) holds them in pinned memory and also fills the
// device copies, on its I/O thread's own copy stream, before it hands the batch out.
struct Batch {
  Tensor samples;                     // f32 [batch_per_rank, sample_shape...] (u8: deliver_to)
  Tensor labels;                      // i32 [batch_per_rank]
  Tensor device_samples, device_labels;  // the same on the cuda device (deliver_to), else empty
  std::vector<std::int64_t> indices;  // the global sample indices, in batch order
  std::int64_t epoch = 0;
  std::int64_t step = 0;  // within the epoch
};

struct PrefetchOptions {
  // Batches read ahead of the one the trainer uses (--data.prefetch); the ring holds depth + 1.
  // 0: every read happens synchronously inside next(), on the caller's thread.
  int depth = 2;
  int io_threads = 1;          // --data.io-threads: threads that each fill whole batches
  int read_delay_ms = 0;       // --data.debug-read-delay-ms: sleep per batch read (testing aid)
  // Test hook, called on the reading thread before each batch read with its (epoch, step); may
  // sleep or throw. Called concurrently from several I/O threads.
  std::function<void(std::int64_t epoch, std::int64_t step)> before_read;
};

// Reads the batches of a ShardPlan ahead of the trainer on background I/O threads, into a ring
// of planned buffers, and hands them out in plan order. next() and release() never allocate.
// An exception thrown while reading batch k (a UserError from the reader: a damaged file,
// non-finite data) is rethrown, unchanged, by the next() that would have returned batch k.
class Prefetcher {
 public:
  // READERS (not owned, one per I/O thread, all of the same file, outliving this object) read
  // the batches; with depth 0 only readers[0] is used. PLAN is copied, once per I/O thread.
  // Throws UserError naming the option for invalid OPTIONS.
  Prefetcher(std::vector<DatasetReader*> readers, const ShardPlan& plan,
             const PrefetchOptions& options);
  ~Prefetcher();  // stops and joins the I/O threads, also mid-epoch and with the ring full
  // The option checks of the constructor, for setup code that wants them before opening readers.
  static void validate(const PrefetchOptions& options);
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Starts delivering TOTAL_STEPS batches from step FIRST_STEP of epoch FIRST_EPOCH on, walking
  // across epoch boundaries. Stops (and joins) any earlier sequence first.
  void start(std::int64_t first_epoch, std::int64_t first_step, std::int64_t total_steps);
  // The next batch in plan order, blocking until it is read. Valid until release(). Calling it
  // past the TOTAL_STEPS batches or twice without release() is a programming error.
  const Batch& next();
  // Hands the batch from next() back to the I/O threads for refilling.
  void release();
  // Stops the I/O threads and joins them; pending batches are dropped. Idempotent.
  void stop();
  // Device::cuda: every batch also arrives on the current cuda device, ready when next()
  // returns it. The host buffers move to pinned memory and each slot gets device buffers (all
  // planned here); an I/O thread copies a batch over on a copy stream of its own right after
  // reading it and waits for the copy there, so the trainer's thread never waits on a copy.
  // release() marks the compute stream's progress, and the copy that refills a slot waits on the
  // device for the kernels that read its previous batch. Device::cpu: nothing changes. Call
  // before start(); the current device must be the one to train on.
  // RAW_U8 (uint8 data only): the samples travel as stored, u8 [batch, sample_shape...] in
  // Batch::samples and device_samples (a quarter of the f32 bytes, and no conversion on the I/O
  // thread), for a consumer that normalises them with kernels::normalize_u8 and
  // u8_normalization(). On Device::cpu too, where the host buffers become u8.
  void deliver_to(Device device, bool raw_u8 = false);

 private:
  struct Slot {
    Batch batch;
    std::int64_t sequence = -1;  // which batch of the run it holds; ready once filled
    bool ready = false;
    // cuda delivery: recorded by release() after the launches that read the batch.
    std::unique_ptr<device_memory::ComputeMark> consumed;
  };
  void io_loop(int worker);
  void fill(int worker, ShardPlan& plan, std::int64_t sequence, Slot& slot);
  std::pair<std::int64_t, std::int64_t> position_of(std::int64_t sequence) const;

  std::vector<DatasetReader*> readers_;
  std::vector<ShardPlan> plans_;  // one per I/O thread: ShardPlan caches its permutation
  Device device_ = Device::cpu;   // where batches are delivered (deliver_to)
  std::vector<std::unique_ptr<device_memory::CopyQueue>> copy_queues_;  // one per I/O thread
  PrefetchOptions options_;
  std::vector<Slot> slots_;       // depth + 1, or 1 when reading synchronously
  std::int64_t steps_per_epoch_ = 0;
  std::int64_t first_epoch_ = 0, first_step_ = 0, total_steps_ = 0;
  std::int64_t taken_ = 0;     // batches handed out by next()
  std::int64_t released_ = 0;  // batches handed back; slot k % slots is free once k - slots < released_
  bool holding_ = false;       // next() was called and release() not yet

  std::mutex mutex_;
  std::condition_variable slot_freed_;   // I/O threads wait for room in the ring (or stop)
  std::condition_variable batch_ready_;  // the trainer waits for its batch (or an error)
  bool stopping_ = true;  // until start(); written only by the trainer's thread
  std::exception_ptr error_;           // the first failure, by batch sequence
  std::int64_t error_sequence_ = -1;
  std::vector<std::thread> threads_;
};

// ---- inspection -------------------------------------------------------------------------------

// A human-readable description of any HDF5 file: its kind (mptrain data file, mptrain
// checkpoint or other HDF5), every dataset with shape and dtype, every attribute with its value,
// and for data files the sample count, classes and a label histogram.
std::string inspect_file(const std::string& path);

}  // namespace mpt::data
