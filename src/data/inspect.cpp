// inspect_file (`mptrain inspect FILE`): what an HDF5 file holds, in words, for data files,
// checkpoints and foreign files alike; plus the HDF5 traversal helpers the module shares.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "core/error.hpp"
#include "data/data.hpp"
#include "data/internal.hpp"

namespace mpt::data {
namespace detail {
namespace {

struct ObjectList {
  std::vector<std::string> datasets;
  std::vector<std::string> groups;
};

// Lists objects by opening each link's target (H5Oopen + H5Iget_type), which reads the same on
// HDF5 1.10 and 1.12+, unlike H5Oget_info. Soft links to nothing are skipped.
ObjectList list_objects(hid_t file) {
  auto lock = hdf5_lock();
  std::vector<std::string> paths;
  auto visit = [](hid_t, const char* name, const H5L_info_t* info, void* data) -> herr_t {
    if (info->type == H5L_TYPE_HARD) static_cast<std::vector<std::string>*>(data)->push_back(name);
    return 0;
  };
  MPT_CHECK_HDF5(H5Lvisit(file, H5_INDEX_NAME, H5_ITER_INC, visit, &paths));
  ObjectList objects;
  for (const auto& path : paths) {
    Hdf5Handle object(H5Oopen(file, path.c_str(), H5P_DEFAULT));
    if (!object.valid()) continue;
    const H5I_type_t type = H5Iget_type(object.get());
    if (type == H5I_DATASET) objects.datasets.push_back(path);
    if (type == H5I_GROUP) objects.groups.push_back(path);
  }
  return objects;
}

}  // namespace

std::vector<std::string> list_datasets(hid_t file) { return list_objects(file).datasets; }
std::vector<std::string> list_groups(hid_t file) { return list_objects(file).groups; }

}  // namespace detail

namespace {

std::string format_number(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.6g", value);
  return text;
}

// "name = value" for every attribute of OBJECT, one per line with INDENT.
void describe_attributes(std::ostringstream& out, hid_t object, const std::string& indent) {
  std::vector<std::string> names;
  auto collect = [](hid_t, const char* name, const H5A_info_t*, void* data) -> herr_t {
    static_cast<std::vector<std::string>*>(data)->push_back(name);
    return 0;
  };
  MPT_CHECK_HDF5(H5Aiterate2(object, H5_INDEX_NAME, H5_ITER_INC, nullptr, collect, &names));
  constexpr std::size_t kShown = 16;  // long arrays are elided after this many values
  for (const auto& name : names) {
    Hdf5Handle attribute(H5Aopen(object, name.c_str(), H5P_DEFAULT));
    MPT_CHECK_HDF5(attribute.get());
    Hdf5Handle type(H5Aget_type(attribute.get()));
    Hdf5Handle space(H5Aget_space(attribute.get()));
    const bool scalar = H5Sget_simple_extent_ndims(space.get()) == 0;
    std::vector<std::string> values;
    switch (H5Tget_class(type.get())) {
      case H5T_INTEGER:
        for (auto v :
             hdf5_read_int_array_attribute(object, name).value_or(std::vector<std::int64_t>{}))
          values.push_back(std::to_string(v));
        break;
      case H5T_FLOAT: {
        const hssize_t count = H5Sget_simple_extent_npoints(space.get());
        std::vector<double> numbers(static_cast<std::size_t>(std::max<hssize_t>(count, 0)));
        if (!numbers.empty())
          MPT_CHECK_HDF5(H5Aread(attribute.get(), H5T_NATIVE_DOUBLE, numbers.data()));
        for (double v : numbers) values.push_back(format_number(v));
        break;
      }
      case H5T_STRING:
        for (auto& v :
             hdf5_read_string_array_attribute(object, name).value_or(std::vector<std::string>{}))
          values.push_back(std::string(1, '"').append(v).append(1, '"'));
        break;
      default:
        values.push_back(std::string(1, '<').append(hdf5_type_name(type.get())).append(1, '>'));
        break;
    }
    out << indent << name << " = ";
    if (!scalar) out << '[';
    for (std::size_t i = 0; i < values.size() && i < kShown; ++i)
      out << (i ? ", " : "") << values[i];
    if (values.size() > kShown) out << ", ... (" << values.size() << " values)";
    if (!scalar) out << ']';
    out << '\n';
  }
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> parts;
  std::size_t begin = 0;
  while (!text.empty() && begin <= text.size()) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    parts.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return parts;
}

// N, shape, dtype, classes and chunking of /samples and /labels, a label check and histogram,
// and the reader's verdict. Every problem is reported in the text; nothing here throws.
void describe_data(std::ostringstream& out, hid_t root, const std::string& path) {
  const bool has_labels = hdf5_has_link(root, "labels");
  Hdf5Handle samples(H5Dopen2(root, "samples", H5P_DEFAULT));
  if (!samples.valid()) {
    out << "data: '/samples' is not a readable dataset: " << hdf5_last_error() << '\n';
    return;
  }
  const Shape shape = hdf5_dataset_shape(samples.get());
  Hdf5Handle type(H5Dget_type(samples.get()));
  const std::int64_t n = shape.empty() ? 0 : shape[0];
  const Shape sample_shape(shape.begin() + (shape.empty() ? 0 : 1), shape.end());
  out << "data: N = " << n << ", sample shape " << shape_to_string(sample_shape) << ", dtype "
      << hdf5_type_name(type.get());
  const auto classes = hdf5_read_int_attribute(root, "num_classes");
  out << ", classes " << (classes ? std::to_string(*classes) : std::string("(no attribute)"));
  Hdf5Handle create_properties(H5Dget_create_plist(samples.get()));
  if (H5Pget_layout(create_properties.get()) == H5D_CHUNKED && !shape.empty()) {
    std::vector<hsize_t> chunk(shape.size());
    H5Pget_chunk(create_properties.get(), static_cast<int>(chunk.size()), chunk.data());
    const bool whole = std::equal(chunk.begin() + 1, chunk.end(), shape.begin() + 1,
                                  [](hsize_t c, std::int64_t s) { return static_cast<std::int64_t>(c) == s; });
    std::size_t bytes = H5Tget_size(type.get());
    for (auto extent : chunk) bytes *= extent;
    out << ", chunks of " << chunk[0] << (whole ? " whole samples" : " rows (samples split)") << " ("
        << bytes << " bytes)";
  } else {
    out << ", contiguous";
  }
  out << '\n';

  if (has_labels && classes && n > 0) {
    Hdf5Handle labels_dataset(H5Dopen2(root, "labels", H5P_DEFAULT));
    const Shape labels_shape = labels_dataset.valid() ? hdf5_dataset_shape(labels_dataset.get()) : Shape{};
    if (labels_shape.size() == 1) {
      std::vector<std::int32_t> labels(static_cast<std::size_t>(labels_shape[0]));
      if (hdf5_read_dataset(labels_dataset.get(), H5T_NATIVE_INT32, labels.data()) < 0) {
        out << "labels: cannot be read: " << hdf5_last_error() << '\n';
      } else {
        std::vector<std::int64_t> histogram(static_cast<std::size_t>(std::max<std::int64_t>(*classes, 0)), 0);
        std::int64_t out_of_range = 0, first_bad = -1;
        for (std::size_t i = 0; i < labels.size(); ++i) {
          if (labels[i] < 0 || labels[i] >= *classes) {
            if (out_of_range++ == 0) first_bad = static_cast<std::int64_t>(i);
            continue;
          }
          ++histogram[static_cast<std::size_t>(labels[i])];
        }
        if (out_of_range == 0)
          out << "labels: all " << labels.size() << " in [0, " << *classes << ")\n";
        else
          out << "labels: " << out_of_range << " of " << labels.size() << " outside [0, " << *classes
              << "), the first at index " << first_bad << " (label "
              << labels[static_cast<std::size_t>(first_bad)] << ")\n";
        const auto class_names =
            split_commas(hdf5_read_string_attribute(root, "class_names").value_or(""));
        out << "label histogram:\n";
        for (std::size_t c = 0; c < histogram.size(); ++c) {
          out << "  " << c;
          if (c < class_names.size()) out << " (" << class_names[c] << ")";
          out << ": " << histogram[c] << '\n';
        }
      }
    }
  }

  try {
    ReaderOptions options;
    options.option_prefix = "inspect";
    DatasetReader reader(path, options);
    const DatasetInfo& info = reader.info();
    out << "reader: usable as training data: " << info.num_samples << " samples of shape "
        << shape_to_string(info.sample_shape) << ' ' << dtype_name(info.sample_dtype) << ", "
        << info.num_classes << " classes, normalisation mean " << format_number(info.mean)
        << " std " << format_number(info.std) << '\n';
  } catch (const UserError& error) {
    out << "not usable as training data: " << error.what() << '\n';
  }
}

}  // namespace

std::string inspect_file(const std::string& path) {
  namespace fs = std::filesystem;
  MPT_REQUIRE(fs::exists(path), "file '" + path + "' not found", "check the path");
  MPT_REQUIRE(!fs::is_directory(path), "'" + path + "' is a directory",
              "name a file, e.g. DIR/train.h5 or DIR/ckpt-1000.h5");
  auto lock = hdf5_lock();
  hdf5_quiet();
  MPT_REQUIRE(H5Fis_hdf5(path.c_str()) > 0, "'" + path + "' is not an HDF5 file",
              "inspect reads HDF5 files: mptrain data files, checkpoints, or any other");
  // Every object header must read before the helpers below touch it: they abort on a failure.
  if (const auto damaged = hdf5_probe_file(path))
    throw_user_error("'" + path + "' is damaged: HDF5 cannot read " + *damaged,
                     "the file was truncated or overwritten; for a checkpoint, use an older one "
                     "(ckpt-STEP.h5 in the same directory)");
  Hdf5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  MPT_REQUIRE(file.valid(), "cannot open HDF5 file '" + path + "': " + hdf5_last_error(),
              "the file may be truncated or damaged; on Lustre or NFS set "
              "HDF5_USE_FILE_LOCKING=FALSE");
  const hid_t root = file.get();

  const std::string format = hdf5_read_string_attribute(root, "mptrain_format").value_or("");
  std::string kind = "other HDF5 file (not written by mptrain)";
  if (format == detail::kDataFormat) kind = "mptrain data file";
  if (format == detail::kCheckpointFormat) kind = "mptrain checkpoint";
  if (format == detail::kModelFormat) kind = "mptrain exported model";
  if (format == detail::kPredictionsFormat) kind = "mptrain predictions";
  std::ostringstream out;
  out << path << ": " << kind;
  if (auto version = hdf5_read_int_attribute(root, "format_version"))
    out << ", format_version " << *version;
  out << ", " << fs::file_size(path) << " bytes\n";
  out << "root attributes:\n";
  describe_attributes(out, root, "  ");

  const auto objects = detail::list_objects(root);
  for (const auto& group : objects.groups) {
    Hdf5Handle handle(H5Gopen2(root, group.c_str(), H5P_DEFAULT));
    MPT_CHECK_HDF5(handle.get());
    std::ostringstream attributes;
    describe_attributes(attributes, handle.get(), "    ");
    if (!attributes.str().empty()) out << "group /" << group << "\n" << attributes.str();
  }
  out << "datasets:\n";
  for (const auto& name : objects.datasets) {
    Hdf5Handle dataset(H5Dopen2(root, name.c_str(), H5P_DEFAULT));
    MPT_CHECK_HDF5(dataset.get());
    Hdf5Handle type(H5Dget_type(dataset.get()));
    out << "  /" << name << "  " << hdf5_type_name(type.get()) << ' '
        << shape_to_string(hdf5_dataset_shape(dataset.get()));
    Hdf5Handle create_properties(H5Dget_create_plist(dataset.get()));
    if (H5Pget_layout(create_properties.get()) == H5D_CHUNKED) {
      const int rank = H5Pget_chunk(create_properties.get(), 0, nullptr);
      std::vector<hsize_t> chunk(static_cast<std::size_t>(std::max(rank, 0)));
      if (rank > 0) H5Pget_chunk(create_properties.get(), rank, chunk.data());
      out << " chunks " << shape_to_string(Shape(chunk.begin(), chunk.end()));
    }
    out << '\n';
    describe_attributes(out, dataset.get(), "    ");
  }

  // For anything that looks like a data file: its summary, a check of every label (reported,
  // not fatal, so a broken file still prints), and whether the reader accepts it.
  if (format == detail::kDataFormat || hdf5_has_link(root, "samples")) {
    describe_data(out, root, path);
  }
  return out.str();
}

}  // namespace mpt::data
