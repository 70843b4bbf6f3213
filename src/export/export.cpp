// Export files: written from a checkpoint through the checkpoint's atomic write, verified on load
// in the order that gives the most useful message (format, metadata, spec against the weights,
// then the SHA-256 that catches any other change).
#include "export/export.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <filesystem>

#include "core/build_info.hpp"
#include "core/device_memory.hpp"
#include "core/error.hpp"
#include "core/hdf5.hpp"
#include "core/sha256.hpp"

namespace mpt::exported {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFormat = "mptrain-model";
constexpr std::int32_t kFormatVersion = 1;
constexpr const char* kNormalisation =
    "uint8 samples: float32(x) * (1 / (255 * std)) + (-mean / std), in float32; float samples: as "
    "stored";

// The digest is over little-endian bytes; on such hosts that is memory order.
static_assert(std::endian::native == std::endian::little, "export digest assumes little-endian");

// "dense0" of "dense0/weight", "resblock3/bn1" of "resblock3/bn1/gamma".
std::string layer_of(const std::string& tensor_name) {
  const auto slash = tensor_name.rfind('/');
  return slash == std::string::npos ? tensor_name : tensor_name.substr(0, slash);
}

// Copies the tensors in FROM into the model's named views TO, matching by name and shape.
// KIND is "weights" or "buffers", for messages.
void copy_matching(const std::vector<nn::NamedParam>& to,
                   const std::vector<ckpt::NamedTensor>& from, const std::string& kind,
                   const std::string& spec, const std::string& source) {
  const std::string hint =
      "the file does not match its own model spec (edited, or damaged); "
      "export it again from its checkpoint";
  for (const auto& target : to) {
    const auto found = std::find_if(from.begin(), from.end(), [&](const ckpt::NamedTensor& t) {
      return t.name == target.name;
    });
    MPT_REQUIRE(found != from.end(),
                source + ": layer " + layer_of(target.name) + " of model '" + spec + "' needs " +
                    kind + " '" + target.name + "' of shape " +
                    shape_to_string(target.value.shape()) + ", which the file lacks",
                hint);
    MPT_REQUIRE(found->value.shape() == target.value.shape(),
                source + ": layer " + layer_of(target.name) + " of model '" + spec + "' expects '" +
                    target.name + "' of shape " + shape_to_string(target.value.shape()) +
                    " but the file holds " + shape_to_string(found->value.shape()),
                hint);
    Tensor destination = target.value;  // a view: shares the model's buffer
    // The model may live on the cuda device (a --device=cuda run resuming): a copy across.
    device_memory::copy(destination.raw(), destination.device(), found->value.data<float>(),
                        Device::cpu, static_cast<std::size_t>(destination.numel()) * sizeof(float));
  }
  for (const auto& tensor : from) {
    const bool known = std::any_of(to.begin(), to.end(),
                                   [&](const nn::NamedParam& p) { return p.name == tensor.name; });
    MPT_REQUIRE(known,
                source + ": holds " + kind + " '" + tensor.name + "' that model '" + spec +
                    "' does not have",
                hint);
  }
}

std::vector<ckpt::NamedTensor> as_named_tensors(const std::vector<nn::NamedParam>& params) {
  std::vector<ckpt::NamedTensor> tensors;
  for (const auto& param : params) tensors.push_back({param.name, param.value});
  return tensors;
}

// Reads GROUP/<name> as f32 for every name in NAMES.
std::vector<ckpt::NamedTensor> read_group(hid_t root, const std::string& group,
                                          const std::vector<std::string>& names,
                                          const std::string& path, const std::string& hint) {
  std::vector<ckpt::NamedTensor> tensors;
  for (const auto& name : names) {
    const std::string dataset_path = group + "/" + name;
    MPT_REQUIRE(
        ckpt::valid_tensor_name(name) && hdf5_has_link(root, dataset_path),
        path + ": lacks the dataset '/" + dataset_path + "' that its " + group + "_names lists",
        hint);
    Hdf5Handle dataset(H5Dopen2(root, dataset_path.c_str(), H5P_DEFAULT));
    MPT_REQUIRE(dataset.valid(),
                path + ": cannot open '/" + dataset_path + "': " + hdf5_last_error(), hint);
    Tensor value(hdf5_dataset_shape(dataset.get()), DType::f32);
    MPT_REQUIRE(hdf5_read_dataset(dataset.get(), H5T_NATIVE_FLOAT, value.raw()) >= 0,
                path + ": cannot read '/" + dataset_path + "': " + hdf5_last_error(), hint);
    tensors.push_back({name, std::move(value)});
  }
  return tensors;
}

void write_group(hid_t root, const char* group_name,
                 const std::vector<ckpt::NamedTensor>& tensors) {
  Hdf5Handle group(H5Gcreate2(root, group_name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  MPT_CHECK_HDF5(group.get());
  for (const auto& tensor : tensors)
    hdf5_write_dataset(group.get(), tensor.name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT,
                       tensor.value.shape(), tensor.value.raw());
}

}  // namespace

std::string weights_digest(const ModelFile& file) {
  Sha256 hash;
  for (const auto* group : {&file.weights, &file.buffers})
    for (const auto& tensor : *group) hash.update(tensor.value.raw(), tensor.value.size_bytes());
  hash.update(file.model_spec);
  const char nul = '\0';
  hash.update(&nul, 1);
  for (std::int64_t extent : file.sample_shape) hash.update(&extent, sizeof(extent));
  const std::int64_t classes = file.num_classes;
  hash.update(&classes, sizeof(classes));
  hash.update(&file.input_mean, sizeof(float));
  hash.update(&file.input_std, sizeof(float));
  return hash.hex_digest();
}

void load_into(nn::Model& model, const std::vector<ckpt::NamedTensor>& weights,
               const std::vector<ckpt::NamedTensor>& buffers, const std::string& source) {
  const std::string spec = model.spec();
  const auto model_buffers = model.named_buffers();
  MPT_REQUIRE(model_buffers.empty() || !buffers.empty(),
              source + ": model '" + spec + "' needs " + std::to_string(model_buffers.size()) +
                  " buffers (BatchNorm running statistics, e.g. '" +
                  (model_buffers.empty() ? std::string() : model_buffers.front().name) +
                  "') but the file has no /buffers group",
              "it was written by an mptrain that did not save buffers; train and save it again");
  copy_matching(model.named_params(), weights, "weights", spec, source);
  copy_matching(model_buffers, buffers, "buffers", spec, source);
  model.recast_from_master();
}

nn::Model build_model(const ModelFile& file, DType precision) {
  try {
    nn::Model model =
        nn::Model::build(file.model_spec, file.sample_shape, file.num_classes, precision);
    load_into(model, file.weights, file.buffers, file.path);
    return model;
  } catch (const UserError& error) {
    // The spec's own message names --model.layers, which a predict user never passed.
    if (std::string(error.what()).rfind(file.path + ":", 0) == 0) throw;
    throw_user_error(file.path + ": its model_spec does not build: " + error.what(),
                     "the file was edited or damaged; export it again from its checkpoint");
  }
}

ModelFile export_checkpoint(const std::string& checkpoint, const std::string& out) {
  MPT_REQUIRE(!checkpoint.empty(), "no checkpoint given to export (--checkpoint)",
              "pass --checkpoint=FILE or a directory that holds `latest`");
  MPT_REQUIRE(!out.empty(), "no output file given (--out)", "e.g. --out model.h5");
  const ckpt::LoadedCheckpoint loaded = ckpt::load_weights(checkpoint);
  const auto& meta = loaded.meta;
  MPT_REQUIRE(
      !std::isnan(meta.input_mean) && !std::isnan(meta.input_std),
      "checkpoint '" + loaded.path +
          "' does not record the input normalisation it was trained with (input_mean, input_std)",
      "it was written by an older mptrain: add the training set's mean/std as root "
      "attributes input_mean/input_std with h5py, or train again");
  const fs::path out_dir = fs::path(out).parent_path();
  MPT_REQUIRE(out_dir.empty() || fs::is_directory(out_dir),
              "directory '" + out_dir.string() + "' of --out '" + out + "' does not exist",
              "create it first, or choose another --out");
  nn::Model model =
      nn::Model::build(meta.model_spec, meta.sample_shape, meta.num_classes, DType::f32);
  load_into(model, loaded.weights, loaded.buffers, loaded.path);

  ModelFile file;
  file.path = out;
  file.model_spec = model.spec();
  file.sample_shape = meta.sample_shape;
  file.num_classes = meta.num_classes;
  file.input_mean = static_cast<float>(meta.input_mean);
  file.input_std = static_cast<float>(meta.input_std);
  file.precision = meta.precision;
  // Model order (the canonical layout), from the model that just accepted them.
  file.weights = as_named_tensors(model.named_params());
  file.buffers = as_named_tensors(model.named_buffers());
  file.sha256 = weights_digest(file);
  file.source_checkpoint = loaded.path;
  file.source_step = meta.step;

  ckpt::write_hdf5_atomically(out, "export file", [&](hid_t root) {
    hdf5_write_attribute(root, "mptrain_format", kFormat);
    hdf5_write_attribute(root, "format_version", kFormatVersion);
    hdf5_write_attribute(root, "model_spec", file.model_spec);
    hdf5_write_attribute(root, "sample_shape", std::vector<std::int64_t>(file.sample_shape));
    hdf5_write_attribute(root, "num_classes", static_cast<std::int32_t>(file.num_classes));
    hdf5_write_attribute(root, "input_mean", file.input_mean);
    hdf5_write_attribute(root, "input_std", file.input_std);
    hdf5_write_attribute(root, "input_normalisation", kNormalisation);
    hdf5_write_attribute(root, "precision", file.precision);
    std::vector<std::string> names;
    for (const auto& weight : file.weights) names.push_back(weight.name);
    hdf5_write_attribute(root, "weight_names", names);
    names.clear();
    for (const auto& buffer : file.buffers) names.push_back(buffer.name);
    // HDF5 has no empty string array attribute worth the trouble: no buffers, no attribute.
    if (!names.empty()) hdf5_write_attribute(root, "buffer_names", names);
    hdf5_write_attribute(root, "sha256", file.sha256);
    hdf5_write_attribute(root, "source_checkpoint", file.source_checkpoint);
    hdf5_write_attribute(root, "source_step", file.source_step);
    hdf5_write_attribute(root, "mptrain_version", std::string(MPTRAIN_VERSION));
    hdf5_write_attribute(root, "git_hash", std::string(git_hash()));
    write_group(root, "weights", file.weights);
    if (!file.buffers.empty()) write_group(root, "buffers", file.buffers);
  });
  return file;
}

ModelFile load_model_file(const std::string& path) {
  const std::string export_hint =
      "pass a model file written by `mptrain export --checkpoint C --out FILE`";
  MPT_REQUIRE(!path.empty(), "no model file given (--model)", export_hint);
  MPT_REQUIRE(fs::is_regular_file(path), path + ": model file not found", export_hint);
  ModelFile file;
  file.path = path;
  {
    auto lock = hdf5_lock();
    hdf5_quiet();
    MPT_REQUIRE(H5Fis_hdf5(path.c_str()) > 0, path + ": not an HDF5 file, so not an export file",
                export_hint);
    // Every object header must read (HDF5 verifies their checksums) before the helpers below
    // touch it: they abort the job on a failure of the library.
    const auto damaged_object = hdf5_probe_file(path);
    MPT_REQUIRE(!damaged_object,
                path + ": damaged, HDF5 cannot read " + damaged_object.value_or(""),
                "the file is truncated or damaged; export it again");
    Hdf5Handle handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    MPT_REQUIRE(handle.valid(), path + ": cannot open it: " + hdf5_last_error(),
                "the file is truncated or damaged; export it again");
    const hid_t root = handle.get();
    const auto format = hdf5_read_string_attribute(root, "mptrain_format");
    MPT_REQUIRE(format == kFormat,
                path + ": not an mptrain export file (mptrain_format is '" +
                    format.value_or("missing") + "')",
                format == std::string("mptrain-checkpoint")
                    ? "it is a checkpoint: export it first, `mptrain export --checkpoint " + path +
                          " --out model.h5`"
                    : export_hint);
    const auto version = hdf5_read_int_attribute(root, "format_version");
    MPT_REQUIRE(version && *version == kFormatVersion,
                path + ": export format_version " +
                    (version ? std::to_string(*version) : std::string("missing")) +
                    "; this mptrain reads version " + std::to_string(kFormatVersion),
                "run it with the mptrain version that exported it");
    const std::string damaged = "the file is damaged or was edited; export it again";
    auto require = [&](auto value, const char* name) {
      MPT_REQUIRE(value.has_value(), path + ": lacks the attribute '" + std::string(name) + "'",
                  damaged);
      return *value;
    };
    file.model_spec = require(hdf5_read_string_attribute(root, "model_spec"), "model_spec");
    const auto shape = require(hdf5_read_int_array_attribute(root, "sample_shape"), "sample_shape");
    file.sample_shape.assign(shape.begin(), shape.end());
    file.num_classes =
        static_cast<int>(require(hdf5_read_int_attribute(root, "num_classes"), "num_classes"));
    file.input_mean =
        static_cast<float>(require(hdf5_read_float_attribute(root, "input_mean"), "input_mean"));
    file.input_std =
        static_cast<float>(require(hdf5_read_float_attribute(root, "input_std"), "input_std"));
    file.precision = require(hdf5_read_string_attribute(root, "precision"), "precision");
    file.sha256 = require(hdf5_read_string_attribute(root, "sha256"), "sha256");
    file.source_checkpoint = hdf5_read_string_attribute(root, "source_checkpoint").value_or("");
    file.source_step = hdf5_read_int_attribute(root, "source_step").value_or(0);
    MPT_REQUIRE(file.precision == "fp32" || file.precision == "fp16" || file.precision == "bf16",
                path + ": precision '" + file.precision + "' is not fp32, fp16 or bf16", damaged);
    MPT_REQUIRE(
        std::isfinite(file.input_mean) && std::isfinite(file.input_std) && file.input_std > 0,
        path + ": input_std must be positive and input_mean finite", damaged);
    const auto weight_names =
        require(hdf5_read_string_array_attribute(root, "weight_names"), "weight_names");
    file.weights = read_group(root, "weights", weight_names, path, damaged);
    if (const auto buffer_names = hdf5_read_string_array_attribute(root, "buffer_names"))
      file.buffers = read_group(root, "buffers", *buffer_names, path, damaged);
  }
  // The spec against the weights first (it names the layer), then the digest over everything.
  build_model(file, DType::f32);
  MPT_REQUIRE(weights_digest(file) == file.sha256,
              path + ": weights do not match their SHA-256 (file modified or corrupt)",
              "re-export it with `mptrain export --checkpoint C --out " + path + "`");
  return file;
}

}  // namespace mpt::exported
