// Tensor: a shape, a dtype, a device and a reference-counted buffer. Views share the buffer,
// which lets a model keep all parameters (and all gradients) in one flat, planned allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace mpt {

enum class DType : std::uint8_t { f32, f16, bf16, f64, u8, i32, i64 };
enum class Device : std::uint8_t { cpu, cuda };

std::size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
// Parses "fp32"/"float32", "fp16"/"float16", "bf16", "float64", "uint8", "int32", "int64".
// Throws UserError naming OPTION when NAME is unknown.
DType dtype_from_name(const std::string& name, const std::string& option);
const char* device_name(Device device);

// What Tensor buffers hold on one device (adopted memory excluded), since the process began.
struct TensorMemoryStats {
  std::int64_t allocations = 0;  // buffers created
  std::int64_t live_bytes = 0;   // held now
  std::int64_t peak_bytes = 0;   // the most held at once
};
TensorMemoryStats tensor_memory_stats(Device device);
// Tensor buffers created by the calling thread, on any device: a training loop reads it around
// its steps to show that they allocate nothing (everything is planned before the first step).
std::int64_t tensor_allocations_on_this_thread();

using Shape = std::vector<std::int64_t>;
std::int64_t shape_numel(const Shape& shape);
std::string shape_to_string(const Shape& shape);  // "(64,1,28,28)"

template <class T>
constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<std::uint8_t>() { return DType::u8; }
template <> constexpr DType dtype_of<std::int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<std::int64_t>() { return DType::i64; }

class Tensor {
 public:
  Tensor() = default;
  // Allocates a zero-filled, 64-byte aligned buffer (on the cuda device: cudaMalloc, which
  // aborts in a build without CUDA). Allocation happens at planning time only.
  Tensor(Shape shape, DType dtype, Device device = Device::cpu);

  // A host tensor over memory that OWNER keeps alive and frees (the tensor never frees it), at
  // least 64-byte aligned and SIZE_BYTES(shape) long: memory another component allocates, such
  // as the gradients in a node's shared-memory window (comm::SharedBuffer). Views share OWNER.
  static Tensor adopt(void* bytes, Shape shape, DType dtype, std::shared_ptr<void> owner);
  // A view of NUMEL(shape) elements of BASE starting at element OFFSET; shares BASE's buffer.
  static Tensor view(const Tensor& base, std::int64_t offset, Shape shape);
  // As view(), but re-points OUT in place and reuses its shape's storage, so a loop over row
  // blocks in the training step allocates nothing once OUT has held a shape of this rank.
  static void view_into(Tensor& out, const Tensor& base, std::int64_t offset,
                        std::initializer_list<std::int64_t> shape);
  // The same elements under another shape with the same number of elements.
  Tensor reshaped(Shape shape) const;
  // A new tensor on DEVICE with this tensor's shape, dtype and values (a copy even when
  // DEVICE is this tensor's own device). Synchronous; for planning and tests, not the step.
  Tensor to(Device device) const;

  const Shape& shape() const { return shape_; }
  std::int64_t dim(int axis) const { return shape_.at(static_cast<std::size_t>(axis)); }
  int rank() const { return static_cast<int>(shape_.size()); }
  std::int64_t numel() const { return shape_numel(shape_); }
  std::size_t size_bytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool defined() const { return storage_ != nullptr; }

  void* raw() { return storage_ ? storage_->bytes + offset_ * dtype_size(dtype_) : nullptr; }
  const void* raw() const {
    return storage_ ? storage_->bytes + offset_ * dtype_size(dtype_) : nullptr;
  }
  // Typed access; checks that T matches the dtype (always on: it is cheap and catches misuse).
  template <class T>
  T* data() {
    check_dtype(dtype_of<T>());
    return static_cast<T*>(raw());
  }
  template <class T>
  const T* data() const {
    check_dtype(dtype_of<T>());
    return static_cast<const T*>(raw());
  }

  void zero();  // on the host or the cuda device
  std::string describe() const;  // "f32(64,784) cpu"

 private:
  struct Storage {
    std::byte* bytes = nullptr;
    std::size_t size = 0;
    Device device = Device::cpu;
    std::shared_ptr<void> owner;  // set: the memory is OWNER's (Tensor::adopt), not freed here
    ~Storage();
  };
  void check_dtype(DType expected) const;

  std::shared_ptr<Storage> storage_;
  std::int64_t offset_ = 0;  // in elements
  Shape shape_;
  DType dtype_ = DType::f32;
  Device device_ = Device::cpu;
};

}  // namespace mpt
