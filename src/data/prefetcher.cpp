// Prefetcher: background I/O threads read the ShardPlan's batches ahead of the trainer into a
// ring of planned buffers and hand them out in plan order; and SampleCache, the in-memory copy
// of the stored samples behind --data.cache=memory.
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.hpp"
#include "data/data.hpp"

namespace mpt::data {
namespace {

std::string mebibytes(double bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.0f MiB", bytes / (1 << 20));
  return text;
}

}  // namespace

// ---- SampleCache --------------------------------------------------------------------------------

SampleCache::SampleCache(std::int64_t num_samples, std::size_t sample_bytes,
                         std::size_t limit_bytes, const std::string& limit_text,
                         const std::string& path)
    : num_samples_(num_samples), sample_bytes_(sample_bytes) {
  const double needed = static_cast<double>(num_samples) * static_cast<double>(sample_bytes);
  MPT_REQUIRE(needed <= static_cast<double>(limit_bytes),
              "--data.cache=memory needs " + mebibytes(needed) + " per rank to hold the " +
                  std::to_string(num_samples) + " samples of '" + path +
                  "' (shuffling gives a rank different samples every epoch, so its cache grows "
                  "towards the whole file), but " +
                  limit_text + " is " + mebibytes(static_cast<double>(limit_bytes)),
              "use --data.cache=none, run fewer ranks per node, or set --data.cache-limit-mb=MiB "
              "if you know that much memory is free");
  bytes_.reset(new std::byte[planned_bytes()]);
  state_ = std::make_unique<std::atomic<std::uint8_t>[]>(static_cast<std::size_t>(num_samples));
}

bool SampleCache::lookup(std::int64_t index, std::byte* destination) const {
  if (state_[static_cast<std::size_t>(index)].load(std::memory_order_acquire) != kPresent)
    return false;
  std::memcpy(destination, bytes_.get() + static_cast<std::size_t>(index) * sample_bytes_,
              sample_bytes_);
  return true;
}

void SampleCache::insert(std::int64_t index, const std::byte* source) {
  // Claiming the slot first keeps two I/O threads that read the same sample from writing it at
  // once; the loser simply does not cache its copy.
  std::uint8_t expected = kAbsent;
  auto& state = state_[static_cast<std::size_t>(index)];
  if (!state.compare_exchange_strong(expected, kFilling, std::memory_order_acquire)) return;
  std::memcpy(bytes_.get() + static_cast<std::size_t>(index) * sample_bytes_, source,
              sample_bytes_);
  state.store(kPresent, std::memory_order_release);
  cached_.fetch_add(1, std::memory_order_relaxed);
}

std::size_t available_memory_per_rank(int ranks_per_node) {
  std::size_t available = 0;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    std::size_t kibibytes = 0;
    if (fields >> kibibytes) available = kibibytes << 10;
    break;
  }
  if (available == 0) {  // no /proc (or an old kernel): free pages, which ignores the page cache
    const long pages = sysconf(_SC_AVPHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page_size > 0)
      available = static_cast<std::size_t>(pages) * static_cast<std::size_t>(page_size);
  }
  return available / static_cast<std::size_t>(std::max(1, ranks_per_node));
}

// ---- Prefetcher ---------------------------------------------------------------------------------

void Prefetcher::validate(const PrefetchOptions& options) {
  MPT_REQUIRE(options.depth >= 0 && options.depth <= 64,
              "--data.prefetch must be in [0, 64], got " + std::to_string(options.depth),
              "batches read ahead of the one in use: 2 is the default, 0 reads synchronously");
  MPT_REQUIRE(options.io_threads >= 1 && options.io_threads <= 64,
              "--data.io-threads must be in [1, 64], got " + std::to_string(options.io_threads),
              "1 is the default; more only helps where decoding, not the file, is the bottleneck");
  MPT_REQUIRE(options.io_threads == 1 || options.io_threads <= options.depth,
              "--data.io-threads=" + std::to_string(options.io_threads) +
                  " needs --data.prefetch >= " + std::to_string(options.io_threads) + ", got " +
                  std::to_string(options.depth),
              "each I/O thread fills one read-ahead batch at a time; raise --data.prefetch or "
              "lower --data.io-threads");
  MPT_REQUIRE(
      options.read_delay_ms >= 0,
      "--data.debug-read-delay-ms must be >= 0, got " + std::to_string(options.read_delay_ms),
      "it is a testing aid; leave it at 0 for real runs");
}

Prefetcher::Prefetcher(std::vector<DatasetReader*> readers, const ShardPlan& plan,
                       const PrefetchOptions& options)
    : readers_(std::move(readers)), options_(options), steps_per_epoch_(plan.steps_per_epoch()) {
  validate(options);
  const int workers = options.depth == 0 ? 1 : options.io_threads;
  if (static_cast<int>(readers_.size()) < workers || readers_.front() == nullptr)
    abort_job("Prefetcher: " + std::to_string(workers) + " readers needed, " +
              std::to_string(readers_.size()) + " given");
  plans_.assign(static_cast<std::size_t>(workers), plan);

  // Every buffer is planned here; next() and release() only move ownership of slots.
  const DatasetInfo& info = readers_.front()->info();
  Shape samples_shape{plan.batch_per_rank()};
  samples_shape.insert(samples_shape.end(), info.sample_shape.begin(), info.sample_shape.end());
  slots_.resize(static_cast<std::size_t>(options.depth + 1));
  for (Slot& slot : slots_) {
    slot.batch.samples = Tensor(samples_shape, DType::f32);
    slot.batch.labels = Tensor({plan.batch_per_rank()}, DType::i32);
    slot.batch.indices.reserve(static_cast<std::size_t>(plan.batch_per_rank()));
  }
}

Prefetcher::~Prefetcher() { stop(); }

void Prefetcher::deliver_to(Device device, bool raw_u8) {
  if (!threads_.empty() || !stopping_) abort_job("Prefetcher::deliver_to: called after start()");
  if (raw_u8 && readers_.front()->info().sample_dtype != DType::u8)
    abort_job("Prefetcher::deliver_to: raw uint8 batches asked for data of another dtype ('" +
              readers_.front()->info().path + "')");
  device_ = device;
  const DType samples_dtype = raw_u8 ? DType::u8 : DType::f32;
  if (device == Device::cpu) {
    if (raw_u8)
      for (Slot& slot : slots_)
        slot.batch.samples = Tensor(slot.batch.samples.shape(), samples_dtype);
    return;
  }
  for (Slot& slot : slots_) {
    Batch& batch = slot.batch;
    batch.samples = device_memory::pinned_host_tensor(batch.samples.shape(), samples_dtype);
    batch.labels = device_memory::pinned_host_tensor(batch.labels.shape(), DType::i32);
    batch.device_samples = Tensor(batch.samples.shape(), samples_dtype, device);
    batch.device_labels = Tensor(batch.labels.shape(), DType::i32, device);
    slot.consumed = std::make_unique<device_memory::ComputeMark>();
  }
  copy_queues_.clear();
  for (std::size_t worker = 0; worker < plans_.size(); ++worker)
    copy_queues_.push_back(std::make_unique<device_memory::CopyQueue>());
}

std::pair<std::int64_t, std::int64_t> Prefetcher::position_of(std::int64_t sequence) const {
  const std::int64_t absolute = first_step_ + sequence;
  return {first_epoch_ + absolute / steps_per_epoch_, absolute % steps_per_epoch_};
}

void Prefetcher::start(std::int64_t first_epoch, std::int64_t first_step,
                       std::int64_t total_steps) {
  stop();
  first_epoch_ = first_epoch;
  first_step_ = first_step;
  total_steps_ = total_steps;
  taken_ = released_ = 0;
  holding_ = false;
  stopping_ = false;
  error_ = nullptr;
  error_sequence_ = -1;
  for (Slot& slot : slots_) {
    slot.sequence = -1;
    slot.ready = false;
  }
  if (options_.depth == 0) return;  // next() reads on the caller's thread
  for (int worker = 0; worker < options_.io_threads; ++worker)
    threads_.emplace_back([this, worker] { io_loop(worker); });
}

void Prefetcher::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  // Wakes I/O threads waiting for a free slot or sleeping in the debug delay; one inside an
  // HDF5 read finishes that read (bounded) and then sees stopping_.
  slot_freed_.notify_all();
  batch_ready_.notify_all();
  for (auto& thread : threads_) thread.join();
  threads_.clear();
}

void Prefetcher::fill(int worker, ShardPlan& plan, std::int64_t sequence, Slot& slot) {
  Batch& batch = slot.batch;
  const auto [epoch, step] = position_of(sequence);
  if (options_.before_read) options_.before_read(epoch, step);
  if (options_.read_delay_ms > 0) {
    // A wait rather than a sleep, so that stop() does not have to sit out the delay.
    std::unique_lock lock(mutex_);
    slot_freed_.wait_for(lock, std::chrono::milliseconds(options_.read_delay_ms),
                         [this] { return stopping_; });
    if (stopping_) return;
  }
  plan.batch_indices(epoch, step, batch.indices);
  readers_[static_cast<std::size_t>(worker)]->read_batch(batch.indices, batch.samples,
                                                         batch.labels);
  batch.epoch = epoch;
  batch.step = step;
  if (device_ == Device::cpu) return;
  // The device buffers may still be read by the kernels of the slot's previous batch: the copy
  // waits for them on the device. This thread then waits for the copy, so that a batch marked
  // ready is ready on the device too, and the trainer's thread never waits on a copy.
  device_memory::CopyQueue& queue = *copy_queues_[static_cast<std::size_t>(worker)];
  queue.wait(*slot.consumed);
  queue.to_device(batch.device_samples.raw(), batch.samples.raw(), batch.samples.size_bytes());
  queue.to_device(batch.device_labels.raw(), batch.labels.raw(), batch.labels.size_bytes());
  queue.finish();
}

void Prefetcher::io_loop(int worker) {
  const auto ring = static_cast<std::int64_t>(slots_.size());
  for (std::int64_t sequence = worker; sequence < total_steps_; sequence += options_.io_threads) {
    Slot& slot = slots_[static_cast<std::size_t>(sequence % ring)];
    {
      // The slot is free once the batch that held it before, sequence - ring, was released.
      std::unique_lock lock(mutex_);
      slot_freed_.wait(lock, [&] {
        return stopping_ || (error_ && error_sequence_ < sequence) || sequence - ring < released_;
      });
      if (stopping_ || (error_ && error_sequence_ < sequence)) return;
    }
    try {
      fill(worker, plans_[static_cast<std::size_t>(worker)], sequence, slot);
    } catch (...) {
      {
        std::lock_guard lock(mutex_);
        // Keep the earliest failure: batches before it are still delivered, in order.
        if (!error_ || sequence < error_sequence_) {
          error_ = std::current_exception();
          error_sequence_ = sequence;
        }
      }
      batch_ready_.notify_all();
      slot_freed_.notify_all();  // other I/O threads past the failure stop
      return;
    }
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      slot.sequence = sequence;
      slot.ready = true;
    }
    batch_ready_.notify_all();
  }
}

const Batch& Prefetcher::next() {
  if (holding_) abort_job("Prefetcher::next: the previous batch was not released");
  if (taken_ >= total_steps_)
    abort_job("Prefetcher::next: all " + std::to_string(total_steps_) + " batches were taken");
  if (stopping_) abort_job("Prefetcher::next: called before start() or after stop()");
  const std::int64_t sequence = taken_;
  if (options_.depth == 0) {
    Slot& slot = slots_.front();
    fill(0, plans_.front(), sequence, slot);  // throws straight to the caller
    slot.sequence = sequence;
  } else {
    Slot& slot =
        slots_[static_cast<std::size_t>(sequence % static_cast<std::int64_t>(slots_.size()))];
    std::unique_lock lock(mutex_);
    batch_ready_.wait(lock, [&] {
      return (slot.ready && slot.sequence == sequence) || (error_ && error_sequence_ <= sequence);
    });
    if (!(slot.ready && slot.sequence == sequence)) std::rethrow_exception(error_);
  }
  ++taken_;
  holding_ = true;
  return slots_[static_cast<std::size_t>(sequence % static_cast<std::int64_t>(slots_.size()))]
      .batch;
}

void Prefetcher::release() {
  if (!holding_) abort_job("Prefetcher::release: no batch is held");
  holding_ = false;
  Slot& slot = slots_[static_cast<std::size_t>(released_ % static_cast<std::int64_t>(slots_.size()))];
  // Before the slot is handed back: the copy that refills it waits for this mark.
  if (slot.consumed) slot.consumed->record();
  if (options_.depth == 0) {
    ++released_;
    return;
  }
  {
    std::lock_guard lock(mutex_);
    slot.ready = false;
    ++released_;
  }
  slot_freed_.notify_all();
}

}  // namespace mpt::data
