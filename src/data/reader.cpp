// DatasetReader: opens one or more data files as one dataset, validates them completely, then
// serves random batches from sorted indices coalesced into runs (one read per run and file) and a
// fused gather + normalise pass.
#include <glob.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/error.hpp"
#include "data/data.hpp"
#include "data/internal.hpp"

namespace mpt::data {
namespace {

std::string trim(const std::string& text) {
  const auto begin = text.find_first_not_of(" \t");
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(" \t") - begin + 1);
}

std::string format_float(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.6g", value);
  return text;
}

}  // namespace

U8Normalization u8_normalization(const DatasetInfo& info) {
  return {1.0f / (255.0f * info.std), -info.mean / info.std};
}

NonFiniteAction parse_nonfinite_action(const std::string& text) {
  if (text == "error") return NonFiniteAction::error;
  if (text == "skip") return NonFiniteAction::skip;
  throw_user_error("unknown value '" + text + "' for --data.on-nonfinite",
                   "use --data.on-nonfinite=error (stop at the first NaN or Inf) or skip");
}

std::vector<std::string> expand_data_paths(const std::string& path, const std::string& option) {
  std::vector<std::string> files;
  std::size_t begin = 0;
  while (begin <= path.size()) {
    const std::size_t end = std::min(path.find(',', begin), path.size());
    const std::string item = trim(path.substr(begin, end - begin));
    begin = end + 1;
    if (item.empty()) continue;
    if (item.find_first_of("*?[") == std::string::npos) {
      files.push_back(item);  // a plain name; a missing file is reported when it is opened
      continue;
    }
    glob_t matches{};
    const int status = ::glob(item.c_str(), 0, nullptr, &matches);
    std::vector<std::string> found;
    if (status == 0)
      for (std::size_t i = 0; i < matches.gl_pathc; ++i) found.emplace_back(matches.gl_pathv[i]);
    ::globfree(&matches);
    MPT_REQUIRE(!found.empty(), "no data file matches '" + item + "' (option " + option + ")",
                "check the pattern; it is expanded by glob(3), e.g. data/part-*.h5");
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  MPT_REQUIRE(!files.empty(), "no data file given (option " + option + " is '" + path + "')",
              "name one .h5 file, a comma-separated list or a glob pattern");
  return files;
}

DatasetReader::DatasetReader(const std::string& path, const ReaderOptions& options)
    : option_prefix_(options.option_prefix), on_nonfinite_(options.on_nonfinite) {
  info_.path = path;
  open_and_validate(options);
  // As resolved by the first file (an option, else the file's attribute, else the default).
  info_.samples_name = files_.front()->samples_name();
  info_.labels_name = files_.front()->labels_name();
}

DatasetReader::~DatasetReader() = default;

std::int64_t DatasetReader::direct_samples_read() const {
  std::int64_t total = 0;
  for (const auto& file : files_) total += file->direct_reads();
  return total;
}

std::int64_t DatasetReader::hdf5_samples_read() const {
  std::int64_t total = 0;
  for (const auto& file : files_) total += file->hdf5_reads();
  return total;
}

void DatasetReader::open_and_validate(const ReaderOptions& options) {
  info_.files = expand_data_paths(info_.path, option_prefix_);
  if (info_.files.size() > 1) {
    info_.path.clear();
    for (const auto& file : info_.files) info_.path += (info_.path.empty() ? "" : ",") + file;
  } else {
    info_.path = info_.files.front();
  }
  file_begin_.assign(1, 0);
  for (const auto& path : info_.files) {
    files_.push_back(std::make_unique<detail::DataFile>(path, options));
    file_begin_.push_back(file_begin_.back() + files_.back()->num_samples());
  }
  const detail::DataFile& first = *files_.front();
  info_.num_samples = file_begin_.back();
  info_.sample_dtype = first.sample_dtype();
  sample_bytes_ = first.staged_sample_bytes();
  sample_elements_ = shape_numel(first.stored_sample_shape());

  // Every file of a multi-file dataset must be a piece of the same data.
  for (const auto& file : files_) {
    const std::string mismatch = file->description() + " does not match " + first.description() +
                                 " (the files of one dataset must agree): ";
    const char* hint = "concatenate only pieces of one dataset, prepared the same way";
    MPT_REQUIRE(file->stored_sample_shape() == first.stored_sample_shape(),
                mismatch + "dataset '" + file->samples_name() + "' has samples of shape " +
                    shape_to_string(file->stored_sample_shape()) + " against " +
                    shape_to_string(first.stored_sample_shape()),
                hint);
    MPT_REQUIRE(file->sample_dtype() == first.sample_dtype(),
                mismatch + "dataset '" + file->samples_name() + "' has dtype " +
                    dtype_name(file->sample_dtype()) + " against " +
                    dtype_name(first.sample_dtype()),
                hint);
    auto same = [](const auto& a, const auto& b) { return a.has_value() == b.has_value() && (!a || *a == *b); };
    MPT_REQUIRE(same(file->num_classes_attribute, first.num_classes_attribute),
                mismatch + "attribute num_classes is " +
                    (file->num_classes_attribute ? std::to_string(*file->num_classes_attribute)
                                                 : std::string("absent")) +
                    " against " +
                    (first.num_classes_attribute ? std::to_string(*first.num_classes_attribute)
                                                 : std::string("absent")),
                hint);
    MPT_REQUIRE(same(file->sample_shape_attribute, first.sample_shape_attribute),
                mismatch + "attribute sample_shape differs", hint);
    if (info_.sample_dtype == DType::u8)
      MPT_REQUIRE(same(file->mean_attribute, first.mean_attribute) &&
                      same(file->std_attribute, first.std_attribute),
                  mismatch + "the normalisation attributes mean/std differ (" +
                      format_float(file->mean_attribute.value_or(NAN)) + "/" +
                      format_float(file->std_attribute.value_or(NAN)) + " against " +
                      format_float(first.mean_attribute.value_or(NAN)) + "/" +
                      format_float(first.std_attribute.value_or(NAN)) + ")",
                  hint);
  }
  const std::string& file_text = first.description();
  const std::string samples_text = first.samples_description();

  // Classes: the file's attribute, else --data.num-classes; both given must agree.
  const auto& declared_classes = first.num_classes_attribute;
  MPT_REQUIRE(declared_classes.has_value() || options.num_classes > 0,
              file_text + " has no integer attribute 'num_classes' on its root group, and "
                          "--data.num-classes is not set",
              "pass --data.num-classes=C, or add the attribute, e.g. in h5py: "
              "f.attrs['num_classes'] = 10 (see docs/data-format.md)");
  MPT_REQUIRE(!declared_classes || options.num_classes <= 0 ||
                  *declared_classes == options.num_classes,
              file_text + " has num_classes = " + std::to_string(declared_classes.value_or(0)) +
                  " but --data.num-classes is " + std::to_string(options.num_classes),
              "leave --data.num-classes out for files that carry the attribute");
  const std::int64_t num_classes = declared_classes ? *declared_classes : options.num_classes;
  MPT_REQUIRE(num_classes >= 1 && num_classes <= (1 << 24),
              file_text + " has num_classes = " + std::to_string(num_classes),
              "num_classes must be a positive class count");
  info_.num_classes = static_cast<int>(num_classes);

  // Sample shape: as stored, or a reshape of it declared by the attribute or --data.sample-shape.
  info_.sample_shape = first.stored_sample_shape();
  auto apply_reshape = [&](const Shape& shape, const std::string& source) {
    MPT_REQUIRE(!shape.empty() && shape_numel(shape) == sample_elements_ &&
                    std::all_of(shape.begin(), shape.end(), [](auto e) { return e > 0; }),
                file_text + ": " + source + " " + shape_to_string(shape) + " does not fit " +
                    samples_text + ", whose samples have shape " +
                    shape_to_string(first.stored_sample_shape()) + " (" +
                    std::to_string(sample_elements_) + " elements)",
                "the sample shape may only regroup the same number of elements");
    info_.sample_shape = shape;
  };
  if (first.sample_shape_attribute)
    apply_reshape(*first.sample_shape_attribute, "the attribute sample_shape");
  if (!options.sample_shape.empty()) {
    MPT_REQUIRE(!first.sample_shape_attribute || *first.sample_shape_attribute == options.sample_shape,
                file_text + " declares sample_shape " +
                    shape_to_string(first.sample_shape_attribute.value_or(Shape{})) +
                    " but --data.sample-shape is " + shape_to_string(options.sample_shape),
                "leave --data.sample-shape out for files that carry the attribute");
    apply_reshape(options.sample_shape, "--data.sample-shape");
  }

  // Normalisation of uint8 pixels: the attributes, else --data.mean/--data.std, else 0 and 1.
  auto resolve = [&](const std::optional<double>& attribute, float option, const char* name,
                     double fallback) {
    if (attribute && !std::isnan(option) && static_cast<float>(*attribute) != option)
      throw_user_error(file_text + " has " + name + " = " + format_float(*attribute) +
                           " but --data." + name + " is " + format_float(option),
                       std::string("leave --data.") + name +
                           " out for files that carry the attribute");
    if (attribute) return *attribute;
    return std::isnan(option) ? fallback : static_cast<double>(option);
  };
  info_.mean = static_cast<float>(resolve(first.mean_attribute, options.mean, "mean", 0.0));
  info_.std = static_cast<float>(resolve(first.std_attribute, options.std, "std", 1.0));
  MPT_REQUIRE(std::isfinite(info_.mean) && std::isfinite(info_.std) && info_.std > 0,
              file_text + " has mean " + std::to_string(info_.mean) + " and std " +
                  std::to_string(info_.std) + "; std must be positive and both finite",
              "fix the mean/std attributes or --data.mean/--data.std (they normalise the "
              "[0,1]-scaled pixels)");
  const U8Normalization normalization = u8_normalization(info_);
  scale_ = normalization.scale;
  shift_ = normalization.shift;

  // Every label in range, then all of them in one array indexed by global sample index.
  labels_.reserve(static_cast<std::size_t>(info_.num_samples));
  for (auto& file : files_) {
    const auto& labels = file->labels;
    for (std::size_t i = 0; i < labels.size(); ++i) {
      MPT_REQUIRE(labels[i] >= 0 && labels[i] < info_.num_classes,
                  file->labels_description() + ": label " + std::to_string(labels[i]) +
                      " at index " + std::to_string(i) + " is outside [0, num_classes) = [0, " +
                      std::to_string(info_.num_classes) + ")",
                  "the num_classes attribute (or --data.num-classes) is wrong or the labels are "
                  "damaged; fix either");
    }
    labels_.insert(labels_.end(), labels.begin(), labels.end());
    std::vector<std::int32_t>().swap(file->labels);  // one copy is enough
  }
}

void DatasetReader::read_range(std::int64_t begin, std::int64_t count, std::byte* out) {
  // The file holding BEGIN: the last whose first index is <= BEGIN.
  auto file = static_cast<std::size_t>(
      std::upper_bound(file_begin_.begin(), file_begin_.end(), begin) - file_begin_.begin() - 1);
  while (count > 0) {
    const std::int64_t local = begin - file_begin_[file];
    const std::int64_t piece = std::min(count, file_begin_[file + 1] - begin);
    files_[file]->read(local, piece, out);
    ++file_reads_;
    out += static_cast<std::size_t>(piece) * sample_bytes_;
    begin += piece;
    count -= piece;
    ++file;
  }
}

void DatasetReader::read_batch(std::span<const std::int64_t> indices, Tensor& samples,
                               Tensor& labels) {
  const auto count = static_cast<std::int64_t>(indices.size());
  // Wrong tensors are a programming error in the caller, not a user mistake.
  const bool raw = samples.dtype() == DType::u8;  // the stored bytes, as they are
  if ((samples.dtype() != DType::f32 && !(raw && info_.sample_dtype == DType::u8)) ||
      samples.rank() != 1 + static_cast<int>(info_.sample_shape.size()) || samples.dim(0) < count ||
      !std::equal(info_.sample_shape.begin(), info_.sample_shape.end(),
                  samples.shape().begin() + 1))
    abort_job("DatasetReader::read_batch: samples tensor " + samples.describe() +
              " does not fit f32 (or u8, for uint8 data) [n >= " + std::to_string(count) + ", " +
              shape_to_string(info_.sample_shape) + "] for '" + info_.path + "'");
  if (labels.dtype() != DType::i32 || labels.rank() != 1 || labels.dim(0) < count)
    abort_job("DatasetReader::read_batch: labels tensor " + labels.describe() +
              " does not fit i32 [n >= " + std::to_string(count) + "]");
  if (count == 0) return;

  // Sort (keeping each index's batch position) so that consecutive indices merge into runs,
  // each read as one hyperslab block in file order.
  sorted_.resize(indices.size());
  for (std::int64_t position = 0; position < count; ++position) {
    const std::int64_t index = indices[static_cast<std::size_t>(position)];
    if (index < 0 || index >= info_.num_samples)
      abort_job("DatasetReader::read_batch: index " + std::to_string(index) + " outside [0, " +
                std::to_string(info_.num_samples) + ") of '" + info_.path + "'");
    sorted_[static_cast<std::size_t>(position)] = {index, position};
  }
  std::sort(sorted_.begin(), sorted_.end());
  slot_of_position_.resize(indices.size());
  runs_.clear();
  // Staging is sized before the loop because cache hits are copied in while runs are built.
  const std::size_t staging_bytes = indices.size() * sample_bytes_;
  if (staging_.size() < staging_bytes) staging_.resize(staging_bytes);
  std::int64_t unique = 0, previous = -1;
  for (const auto& [index, position] : sorted_) {
    if (index == previous) {  // a duplicate reuses the slot already read
      slot_of_position_[static_cast<std::size_t>(position)] = unique - 1;
      continue;
    }
    previous = index;
    const std::int64_t slot = unique++;
    slot_of_position_[static_cast<std::size_t>(position)] = slot;
    if (cache_ && cache_->lookup(index, staging_.data() + static_cast<std::size_t>(slot) * sample_bytes_))
      continue;  // a hit also ends the current run: its slot lies between the run's neighbours
    Run* last = runs_.empty() ? nullptr : &runs_.back();
    if (last && index == last->begin + last->length && slot == last->first_slot + last->length)
      ++last->length;
    else
      runs_.push_back({index, 1, slot});
  }

  // One read per run, not one H5Dread of an H5S_SELECT_OR union: for an irregular selection
  // HDF5 1.10 maps every element to its chunk one by one, which measured >10x slower on
  // Fashion-MNIST (18-20k vs 270k samples/s for random batches of 256, conversion included).
  // No HDF5 lock here: DataFile takes it around its HDF5 calls only, so direct pread() runs of
  // several I/O threads proceed in parallel.
  for (const Run& run : runs_)
    read_range(run.begin, run.length,
               staging_.data() + static_cast<std::size_t>(run.first_slot) * sample_bytes_);
  if (cache_)
    for (const Run& run : runs_)
      for (std::int64_t i = 0; i < run.length; ++i)
        cache_->insert(run.begin + i,
                       staging_.data() + static_cast<std::size_t>(run.first_slot + i) * sample_bytes_);

  // Gather into batch order and convert, outside the HDF5 lock so that another thread's HDF5
  // work can proceed meanwhile. (Written here rather than with kernels::normalize_u8 because it
  // fuses the gather with the conversion, and because this runs on the prefetcher's I/O thread,
  // where Kokkos host parallel regions must not be entered.)
  std::int32_t* out_labels = labels.data<std::int32_t>();
  const auto elements = static_cast<std::size_t>(sample_elements_);
  if (raw) {
    auto* out_bytes = samples.data<std::uint8_t>();
    for (std::int64_t position = 0; position < count; ++position) {
      const auto slot =
          static_cast<std::size_t>(slot_of_position_[static_cast<std::size_t>(position)]);
      std::memcpy(out_bytes + static_cast<std::size_t>(position) * elements,
                  staging_.data() + slot * elements, elements);
      out_labels[position] = labels_[static_cast<std::size_t>(indices[static_cast<std::size_t>(position)])];
    }
    return;
  }
  float* out = samples.data<float>();
  // Locals, not members: DESTINATION could alias *this for the compiler, which would then
  // reload scale_ and shift_ per element and not vectorise the loop (up to 1.6x slower).
  const float scale = scale_, shift = shift_;
  for (std::int64_t position = 0; position < count; ++position) {
    const auto slot =
        static_cast<std::size_t>(slot_of_position_[static_cast<std::size_t>(position)]);
    float* destination = out + static_cast<std::size_t>(position) * elements;
    const std::int64_t index = indices[static_cast<std::size_t>(position)];
    if (info_.sample_dtype == DType::u8) {
      const auto* source = reinterpret_cast<const std::uint8_t*>(staging_.data()) + slot * elements;
      for (std::size_t e = 0; e < elements; ++e)
        destination[e] = static_cast<float>(source[e]) * scale + shift;
    } else {
      const auto* source = reinterpret_cast<const float*>(staging_.data()) + slot * elements;
      bool finite = true;
      for (std::size_t e = 0; e < elements; ++e) {
        finite &= std::isfinite(source[e]);
        destination[e] = source[e];
      }
      if (!finite) {
        if (on_nonfinite_ == NonFiniteAction::skip) {
          // Zeros keep the forward pass finite; the ignore label keeps them out of loss and
          // gradient (kernels::kIgnoreLabel).
          std::fill(destination, destination + elements, 0.0f);
          out_labels[position] = -1;
          ++skipped_nonfinite_;
          continue;
        }
        const auto bad = static_cast<std::size_t>(
            std::find_if(source, source + elements, [](float v) { return !std::isfinite(v); }) -
            source);
        const auto file = static_cast<std::size_t>(
            std::upper_bound(file_begin_.begin(), file_begin_.end(), index) - file_begin_.begin() -
            1);
        const std::string where =
            files_.size() == 1 ? std::string()
                               : " (index " + std::to_string(index) + " of the whole dataset)";
        throw_user_error("sample " + std::to_string(index - file_begin_[file]) + " of dataset '" +
                             info_.samples_name + "' in data file '" + files_[file]->path() + "'" +
                             where + " (option " +
                             option_prefix_ + ") holds a non-finite value (" +
                             std::to_string(source[bad]) + ") at element " + std::to_string(bad),
                         "clean the data (float samples must be finite), or pass "
                         "--data.on-nonfinite=skip to leave such samples out");
      }
    }
    out_labels[position] = labels_[static_cast<std::size_t>(index)];
  }
}

}  // namespace mpt::data
