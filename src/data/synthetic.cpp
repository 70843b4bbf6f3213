// The synthetic data set: class prototypes blended with per-sample noise, every byte a pure
// function of (seed, class or sample index), generated and written one slab at a time.
#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/error.hpp"
#include "core/random.hpp"
#include "data/data.hpp"
#include "data/internal.hpp"

namespace mpt::data {
namespace {

// Stream ids of CounterRng. Prototypes use stream = class index (small numbers); labels and noise
// use tagged streams, one per split, so the test set does not depend on the training set's size.
constexpr std::uint64_t kLabelStream = 0x4C4142454C00ull;  // "LABEL\0" | split
constexpr std::uint64_t kNoiseStream = 0x4E4F49534500ull;  // "NOISE\0" | split

struct Generator {
  const SyntheticSpec& spec;
  std::int64_t sample_elements;
  std::vector<float> prototypes;  // [class][element], already scaled by (1 - noise)

  explicit Generator(const SyntheticSpec& s)
      : spec(s), sample_elements(shape_numel(s.sample_shape)) {
    prototypes.resize(static_cast<std::size_t>(spec.num_classes * sample_elements));
    for (int c = 0; c < spec.num_classes; ++c) {
      const CounterRng rng(spec.seed, static_cast<std::uint64_t>(c));
      for (std::int64_t e = 0; e < sample_elements; ++e)
        prototypes[static_cast<std::size_t>(c * sample_elements + e)] =
            (1.0f - spec.noise) * 255.0f * rng.uniform(static_cast<std::uint64_t>(e));
    }
  }

  // Sample INDEX of SPLIT (0 train, 1 test) into OUT (sample_elements bytes); returns its label.
  std::int32_t generate(std::uint64_t split, std::int64_t index, std::uint8_t* out) const {
    const auto sample = static_cast<std::uint64_t>(index);
    const auto label =
        static_cast<std::int32_t>(CounterRng(spec.seed, kLabelStream | split)
                                      .below(sample, static_cast<std::uint64_t>(spec.num_classes)));
    const float* prototype = prototypes.data() + static_cast<std::size_t>(label) * sample_elements;
    // Each 64-bit draw supplies the noise bytes of 8 elements; counters never overlap between
    // samples because each sample owns words_per_sample consecutive counters.
    const CounterRng noise(spec.seed, kNoiseStream | split);
    const auto words_per_sample = static_cast<std::uint64_t>((sample_elements + 7) / 8);
    const float noise_weight = spec.noise;
    std::uint64_t bits = 0;
    for (std::int64_t e = 0; e < sample_elements; ++e) {
      if (e % 8 == 0)
        bits = noise.bits(sample * words_per_sample + static_cast<std::uint64_t>(e / 8));
      const float noise_value = static_cast<float>(bits & 0xFF);
      bits >>= 8;
      const float value = prototype[e] + noise_weight * noise_value;
      out[e] = static_cast<std::uint8_t>(std::clamp(std::lround(value), 0L, 255L));
    }
    return label;
  }
};

void write_split(const Generator& generator, std::uint64_t split, std::int64_t num_samples,
                 const std::string& path, detail::PixelStatistics* statistics,
                 detail::DataFileAttributes attributes) {
  const auto sample_bytes = static_cast<std::size_t>(generator.sample_elements);
  const std::int64_t slab =
      std::max<std::int64_t>(1, static_cast<std::int64_t>((4u << 20) / sample_bytes));
  const DType dtype = generator.spec.dtype;
  detail::DataFileWriter writer(path, num_samples, generator.spec.sample_shape, dtype);
  std::vector<std::uint8_t> pixels(static_cast<std::size_t>(std::min(slab, num_samples)) *
                                   sample_bytes);
  std::vector<float> values(dtype == DType::u8 ? 0 : pixels.size());
  std::vector<std::int32_t> labels(static_cast<std::size_t>(std::min(slab, num_samples)));
  for (std::int64_t begin = 0; begin < num_samples; begin += slab) {
    const std::int64_t count = std::min(slab, num_samples - begin);
    for (std::int64_t i = 0; i < count; ++i)
      labels[static_cast<std::size_t>(i)] = generator.generate(
          split, begin + i, pixels.data() + static_cast<std::size_t>(i) * sample_bytes);
    if (dtype == DType::u8) {
      if (statistics)
        statistics->add(pixels.data(), static_cast<std::size_t>(count) * sample_bytes);
      writer.append(pixels.data(), labels.data(), count);
    } else {  // HDF5 rounds float32 to float16 when the file holds float16
      for (std::size_t i = 0; i < static_cast<std::size_t>(count) * sample_bytes; ++i)
        values[i] = static_cast<float>(pixels[i]) / 255.0f;
      writer.append(values.data(), DType::f32, labels.data(), count);
    }
  }
  if (statistics && dtype == DType::u8) {
    attributes.mean = statistics->mean();
    attributes.std = statistics->std();
  }
  writer.finish(attributes);
}

}  // namespace

void prepare_synthetic(const SyntheticSpec& spec, const std::string& out_dir) {
  MPT_REQUIRE(spec.train_samples > 0 && spec.test_samples > 0,
              "synthetic data: train_samples (" + std::to_string(spec.train_samples) +
                  ") and test_samples (" + std::to_string(spec.test_samples) + ") must be positive",
              "ask for at least one sample in each split");
  MPT_REQUIRE(
      spec.num_classes >= 2 && spec.num_classes <= 65536,
      "synthetic data: num_classes " + std::to_string(spec.num_classes) + " is outside [2, 65536]",
      "use at least two classes");
  MPT_REQUIRE(
      !spec.sample_shape.empty() && std::all_of(spec.sample_shape.begin(), spec.sample_shape.end(),
                                                [](std::int64_t extent) { return extent > 0; }),
      "synthetic data: sample shape " + shape_to_string(spec.sample_shape) +
          " must have positive extents",
      "use e.g. 1,28,28 for images or 784 for vectors");
  MPT_REQUIRE(spec.noise >= 0.0f && spec.noise <= 1.0f,
              "synthetic data: noise " + std::to_string(spec.noise) + " is outside [0, 1]",
              "0 gives the bare prototypes, 1 pure noise; 0.35 is the default");
  MPT_REQUIRE(spec.dtype == DType::u8 || spec.dtype == DType::f32 || spec.dtype == DType::f16,
              std::string("synthetic data: dtype ") + dtype_name(spec.dtype) + " is not stored",
              "use --dtype uint8, float16 or float32");
  detail::create_directory(out_dir, "--out");

  const Generator generator(spec);
  detail::DataFileAttributes attributes;
  attributes.num_classes = spec.num_classes;
  attributes.source = "synthetic: seed " + std::to_string(spec.seed) + ", noise " +
                      std::to_string(spec.noise) + ", prototypes blended with uniform noise";
  namespace fs = std::filesystem;
  detail::PixelStatistics statistics;
  write_split(generator, 0, spec.train_samples, (fs::path(out_dir) / "train.h5").string(),
              &statistics, attributes);
  // The test split is normalised with the training split's statistics.
  attributes.mean = statistics.mean();
  attributes.std = statistics.std();
  write_split(generator, 1, spec.test_samples, (fs::path(out_dir) / "test.h5").string(), nullptr,
              attributes);
}

}  // namespace mpt::data
