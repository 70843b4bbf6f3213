// kernels::HostStaging on the host (the cuda twin is tests/gpu's case_staging): a download
// copies only its range into the twin, an upload only its range back, and the twin keeps the
// layout of the data, for f32 and 16-bit tensors.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/staging.hpp"

namespace mpt::kernels {
namespace {

TEST(HostStaging, MovesOnlyTheRangesAskedFor) {
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    constexpr std::int64_t kCount = 1000;
    Tensor data({10, 100}, dtype);
    const std::size_t element = dtype_size(dtype);
    auto* bytes = static_cast<unsigned char*>(data.raw());
    for (std::size_t i = 0; i < data.size_bytes(); ++i) bytes[i] = static_cast<unsigned char>(i * 7 + 1);
    const std::vector<unsigned char> original(bytes, bytes + data.size_bytes());
    HostStaging staging(data, 3);
    ASSERT_EQ(staging.host_tensor().shape(), data.shape());
    ASSERT_EQ(staging.host_tensor().dtype(), dtype);
    auto* twin = static_cast<unsigned char*>(staging.host());
    ASSERT_NE(twin, bytes);
    // Two ranges down (the first 300 elements stay zero in the twin), waited for in any order.
    staging.download(2, 600, kCount);
    staging.download(0, 300, 600);
    staging.wait_downloaded(0);
    staging.wait_downloaded(2);
    for (std::size_t i = 0; i < 300 * element; ++i) ASSERT_EQ(twin[i], 0) << dtype_name(dtype) << " " << i;
    EXPECT_EQ(std::memcmp(twin + 300 * element, bytes + 300 * element, 700 * element), 0) << dtype_name(dtype);
    // Change the twin everywhere; only [300, 600) goes back up.
    std::memset(twin, 0xab, data.size_bytes());
    staging.upload(300, 600);
    staging.join();
    for (std::int64_t i = 0; i < kCount; ++i) {
      const bool uploaded = i >= 300 && i < 600;
      for (std::size_t b = 0; b < element; ++b) {
        const std::size_t at = static_cast<std::size_t>(i) * element + b;
        ASSERT_EQ(bytes[at], uploaded ? 0xab : original[at]) << dtype_name(dtype) << " element " << i;
      }
    }
  }
}

TEST(HostStaging, EmptyRangesMoveNothing) {
  // The data and its twin differ everywhere, so any byte an empty range moved would show.
  Tensor data({8}, DType::f32);
  for (std::int64_t i = 0; i < 8; ++i) data.data<float>()[i] = static_cast<float>(i + 1);
  HostStaging staging(data, 1);
  float* twin = static_cast<float*>(staging.host());
  for (std::int64_t i = 0; i < 8; ++i) twin[i] = -1.f;
  staging.download(0, 8, 8);
  staging.wait_downloaded(0);
  staging.upload(0, 0);
  staging.join();
  for (std::int64_t i = 0; i < 8; ++i) {
    EXPECT_EQ(data.data<float>()[i], static_cast<float>(i + 1)) << i;
    EXPECT_EQ(twin[i], -1.f) << i;
  }
}

}  // namespace
}  // namespace mpt::kernels
