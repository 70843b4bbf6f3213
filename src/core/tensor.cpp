// Tensor storage and dtype bookkeeping (see tensor.hpp).
#include "core/tensor.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "core/device_memory.hpp"
#include "core/error.hpp"

namespace mpt {

namespace {
// Per device: allocations, live bytes, peak bytes. Relaxed: counters, not synchronisation.
struct MemoryCounters {
  std::atomic<std::int64_t> allocations{0}, live{0}, peak{0};
};
MemoryCounters counters[2];  // Device::cpu, Device::cuda
thread_local std::int64_t thread_allocations = 0;

void count_allocation(Device device, std::size_t bytes) {
  MemoryCounters& c = counters[static_cast<int>(device)];
  c.allocations.fetch_add(1, std::memory_order_relaxed);
  const std::int64_t live =
      c.live.fetch_add(static_cast<std::int64_t>(bytes), std::memory_order_relaxed) +
      static_cast<std::int64_t>(bytes);
  std::int64_t peak = c.peak.load(std::memory_order_relaxed);
  while (live > peak && !c.peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
  ++thread_allocations;
}
}  // namespace

TensorMemoryStats tensor_memory_stats(Device device) {
  const MemoryCounters& c = counters[static_cast<int>(device)];
  return {c.allocations.load(std::memory_order_relaxed), c.live.load(std::memory_order_relaxed),
          c.peak.load(std::memory_order_relaxed)};
}

std::int64_t tensor_allocations_on_this_thread() { return thread_allocations; }

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::f64: return 8;
    case DType::u8: return 1;
    case DType::i32: return 4;
    case DType::i64: return 8;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "float32";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
    case DType::f64: return "float64";
    case DType::u8: return "uint8";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
  }
  return "?";
}

DType dtype_from_name(const std::string& name, const std::string& option) {
  if (name == "fp32" || name == "float32") return DType::f32;
  if (name == "fp16" || name == "float16") return DType::f16;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "fp64" || name == "float64") return DType::f64;
  if (name == "uint8") return DType::u8;
  if (name == "int32") return DType::i32;
  if (name == "int64") return DType::i64;
  throw_user_error(option + " has unknown dtype '" + name + "'",
                   "use one of fp32, fp16, bf16, float64, uint8, int32, int64");
}

const char* device_name(Device device) { return device == Device::cpu ? "cpu" : "cuda"; }

std::int64_t shape_numel(const Shape& shape) {
  std::int64_t n = 1;
  for (auto extent : shape) n *= extent;
  return n;
}

std::string shape_to_string(const Shape& shape) {
  std::ostringstream out;
  out << '(';
  for (std::size_t i = 0; i < shape.size(); ++i) out << (i ? "," : "") << shape[i];
  out << ')';
  return out.str();
}

Tensor::Storage::~Storage() {
  if (owner) return;
  counters[static_cast<int>(device)].live.fetch_sub(static_cast<std::int64_t>(size),
                                                    std::memory_order_relaxed);
  if (device == Device::cpu)
    std::free(bytes);
  else
    device_memory::free_cuda(bytes);
}

Tensor::Tensor(Shape shape, DType dtype, Device device)
    : shape_(std::move(shape)), dtype_(dtype), device_(device) {
  for (auto extent : shape_)
    if (extent < 0) abort_job("Tensor: negative extent in shape " + shape_to_string(shape_));
  storage_ = std::make_shared<Storage>();
  const std::size_t bytes = size_bytes();
  // Round up to the alignment, as aligned_alloc requires; never allocate zero bytes.
  const std::size_t padded = ((bytes + 63) / 64) * 64 + 64;
  if (device != Device::cpu) {
    storage_->bytes = static_cast<std::byte*>(device_memory::allocate_cuda(padded));  // zeroed
    storage_->size = bytes;
    storage_->device = device;
    count_allocation(device, bytes);
    return;
  }
  storage_->bytes = static_cast<std::byte*>(std::aligned_alloc(64, padded));
  if (!storage_->bytes) abort_job("Tensor: out of memory allocating " + std::to_string(bytes) + " bytes");
  std::memset(storage_->bytes, 0, padded);
  storage_->size = bytes;
  storage_->device = device;
  count_allocation(device, bytes);
}

Tensor Tensor::adopt(void* bytes, Shape shape, DType dtype, std::shared_ptr<void> owner) {
  if (bytes == nullptr || owner == nullptr || reinterpret_cast<std::uintptr_t>(bytes) % 64 != 0)
    abort_job("Tensor::adopt: needs 64-byte aligned memory and its owner");
  for (auto extent : shape)
    if (extent < 0) abort_job("Tensor::adopt: negative extent in shape " + shape_to_string(shape));
  Tensor result;
  result.shape_ = std::move(shape);
  result.dtype_ = dtype;
  result.storage_ = std::make_shared<Storage>();
  result.storage_->bytes = static_cast<std::byte*>(bytes);
  result.storage_->size = result.size_bytes();
  result.storage_->owner = std::move(owner);
  return result;
}

Tensor Tensor::view(const Tensor& base, std::int64_t offset, Shape shape) {
  Tensor result;
  result.storage_ = base.storage_;
  result.offset_ = base.offset_ + offset;
  result.shape_ = std::move(shape);
  result.dtype_ = base.dtype_;
  result.device_ = base.device_;
  const auto end_bytes = static_cast<std::size_t>(result.offset_ + result.numel()) * dtype_size(result.dtype_);
  if (offset < 0 || !base.storage_ || end_bytes > base.storage_->size)
    abort_job("Tensor::view: view " + shape_to_string(result.shape_) + " at offset " +
              std::to_string(offset) + " exceeds " + base.describe());
  return result;
}

void Tensor::view_into(Tensor& out, const Tensor& base, std::int64_t offset,
                       std::initializer_list<std::int64_t> shape) {
  std::int64_t numel = 1;
  for (auto extent : shape) numel *= extent;
  const auto end_bytes =
      static_cast<std::size_t>(base.offset_ + offset + numel) * dtype_size(base.dtype_);
  if (offset < 0 || numel < 0 || !base.storage_ || end_bytes > base.storage_->size)
    abort_job("Tensor::view_into: view " + shape_to_string(Shape(shape)) + " at offset " +
              std::to_string(offset) + " exceeds " + base.describe());
  out.storage_ = base.storage_;  // a reference-count update, no allocation
  out.offset_ = base.offset_ + offset;
  out.shape_.assign(shape);  // reuses the vector's capacity
  out.dtype_ = base.dtype_;
  out.device_ = base.device_;
}

Tensor Tensor::reshaped(Shape shape) const {
  if (shape_numel(shape) != numel())
    abort_job("Tensor::reshaped: " + shape_to_string(shape) + " does not match " + describe());
  Tensor result = *this;
  result.shape_ = std::move(shape);
  return result;
}

void Tensor::zero() {
  if (!storage_) return;
  if (device_ == Device::cpu)
    std::memset(raw(), 0, size_bytes());
  else
    device_memory::zero_cuda(raw(), size_bytes());
}

Tensor Tensor::to(Device device) const {
  if (!storage_) abort_job("Tensor::to: the tensor is undefined");
  Tensor result(shape_, dtype_, device);
  device_memory::copy(result.raw(), device, raw(), device_, size_bytes());
  return result;
}

std::string Tensor::describe() const {
  return std::string(dtype_name(dtype_)) + shape_to_string(shape_) + " " + device_name(device_);
}

void Tensor::check_dtype(DType expected) const {
  if (expected != dtype_)
    abort_job(std::string("Tensor::data: requested ") + dtype_name(expected) + " from " + describe());
}

}  // namespace mpt
