// `mptrain prepare csv`: a comma-separated file with one sample per line (a label column plus
// feature columns) to an mptrain data file. Two passes: the first checks every field and decides
// the dtype, the second writes, so memory stays bounded whatever the file's size.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/error.hpp"
#include "data/data.hpp"
#include "data/internal.hpp"

namespace mpt::data {
namespace {

// Splits LINE at commas into FIELDS (views into LINE), each trimmed of spaces and a final \r.
void split_fields(const std::string& line, std::vector<std::string_view>& fields) {
  fields.clear();
  std::string_view rest(line);
  if (!rest.empty() && rest.back() == '\r') rest.remove_suffix(1);
  while (true) {
    const std::size_t comma = rest.find(',');
    std::string_view field = rest.substr(0, comma);
    while (!field.empty() && (field.front() == ' ' || field.front() == '\t')) field.remove_prefix(1);
    while (!field.empty() && (field.back() == ' ' || field.back() == '\t')) field.remove_suffix(1);
    fields.push_back(field);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
}

bool parse_number(std::string_view field, double& value) {
  if (field.empty()) return false;
  if (field.front() == '+') field.remove_prefix(1);
  const auto [end, error] = std::from_chars(field.data(), field.data() + field.size(), value);
  return error == std::errc() && end == field.data() + field.size();
}

bool is_blank(const std::string& line) {
  return line.find_first_not_of(" \t\r") == std::string::npos;
}

struct CsvLayout {
  bool header = false;
  std::size_t columns = 0;
  std::size_t label_column = 0;
  std::int64_t rows = 0;
  bool all_bytes = true;  // every feature an integer in [0, 255]
  std::int64_t max_label = -1;
};

const char* kCsvHint = "one sample per line: the label and the features, comma separated";

}  // namespace

void convert_csv(const std::string& csv_path, const std::string& out_path,
                 const ArrayConvertOptions& options) {
  namespace fs = std::filesystem;
  MPT_REQUIRE(fs::exists(csv_path), "CSV file '" + csv_path + "' not found", "check the path");
  MPT_REQUIRE(options.header == "auto" || options.header == "yes" || options.header == "no",
              "--header '" + options.header + "' is not auto, yes or no",
              "--header=auto treats a first line with a non-number as the header");
  const std::string where = "CSV file '" + csv_path + "'";

  // Pass 1: layout, dtype and labels.
  CsvLayout layout;
  std::vector<std::string_view> fields;
  {
    std::ifstream in(csv_path);
    MPT_REQUIRE(in.good(), "cannot open " + where, "check its permissions");
    std::string line;
    std::int64_t line_number = 0;
    bool first = true;
    while (std::getline(in, line)) {
      ++line_number;
      if (is_blank(line)) continue;
      split_fields(line, fields);
      if (first) {
        first = false;
        layout.columns = fields.size();
        MPT_REQUIRE(layout.columns >= 2,
                    where + " line " + std::to_string(line_number) + " has " +
                        std::to_string(layout.columns) + " column; at least a label and a feature "
                        "are needed",
                    kCsvHint);
        const std::int64_t column = options.label_column < 0
                                        ? static_cast<std::int64_t>(layout.columns) +
                                              options.label_column
                                        : options.label_column;
        MPT_REQUIRE(column >= 0 && column < static_cast<std::int64_t>(layout.columns),
                    "--label-column " + std::to_string(options.label_column) + " is outside the " +
                        std::to_string(layout.columns) + " columns of " + where,
                    "columns count from 0; -1 is the last");
        layout.label_column = static_cast<std::size_t>(column);
        double ignored = 0;
        const bool has_text = std::any_of(fields.begin(), fields.end(), [&](std::string_view f) {
          return !parse_number(f, ignored);
        });
        layout.header = options.header == "yes" || (options.header == "auto" && has_text);
        if (layout.header) continue;
      }
      MPT_REQUIRE(fields.size() == layout.columns,
                  where + " line " + std::to_string(line_number) + " has " +
                      std::to_string(fields.size()) + " columns but the first row has " +
                      std::to_string(layout.columns),
                  "every line needs the same number of comma-separated fields");
      for (std::size_t c = 0; c < fields.size(); ++c) {
        double value = 0;
        MPT_REQUIRE(parse_number(fields[c], value) && std::isfinite(value),
                    where + " line " + std::to_string(line_number) + ", column " +
                        std::to_string(c) + ": '" + std::string(fields[c]) +
                        "' is not a finite number",
                    std::string(kCsvHint) + "; a header line is allowed with --header=auto|yes");
        if (c == layout.label_column) {
          MPT_REQUIRE(value >= 0 && value == std::floor(value) && value < 2147483647.0,
                      where + " line " + std::to_string(line_number) + ", label column " +
                          std::to_string(c) + ": '" + std::string(fields[c]) +
                          "' is not a class index (0, 1, 2, ...)",
                      "name the label column with --label-column (0-based)");
          layout.max_label = std::max(layout.max_label, static_cast<std::int64_t>(value));
        } else if (layout.all_bytes) {
          layout.all_bytes = value >= 0 && value <= 255 && value == std::floor(value);
        }
      }
      ++layout.rows;
    }
  }
  MPT_REQUIRE(layout.rows > 0, where + " holds no samples", kCsvHint);

  const DType dtype = layout.all_bytes ? DType::u8 : DType::f32;
  const auto features = static_cast<std::int64_t>(layout.columns - 1);
  const Shape shape = detail::converted_sample_shape({features}, options.sample_shape, where);
  detail::create_parent_directory(out_path);
  const std::int64_t slab = std::max<std::int64_t>(1, (1 << 20) / features);
  std::vector<std::uint8_t> bytes(dtype == DType::u8 ? static_cast<std::size_t>(slab * features) : 0);
  std::vector<float> floats(dtype == DType::f32 ? static_cast<std::size_t>(slab * features) : 0);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(slab));
  detail::DataFileWriter writer(out_path, layout.rows, shape, dtype);
  detail::PixelStatistics statistics;

  // Pass 2: the values, already known to be valid.
  std::ifstream in(csv_path);
  std::string line;
  bool skip_header = layout.header;
  std::int64_t in_slab = 0;
  auto flush = [&] {
    if (in_slab == 0) return;
    if (dtype == DType::u8) {
      statistics.add(bytes.data(), static_cast<std::size_t>(in_slab * features));
      writer.append(bytes.data(), labels.data(), in_slab);
    } else {
      writer.append(floats.data(), DType::f32, labels.data(), in_slab);
    }
    in_slab = 0;
  };
  while (std::getline(in, line)) {
    if (is_blank(line)) continue;
    if (skip_header) {
      skip_header = false;
      continue;
    }
    split_fields(line, fields);
    std::int64_t feature = 0;
    for (std::size_t c = 0; c < fields.size(); ++c) {
      double value = 0;
      parse_number(fields[c], value);
      if (c == layout.label_column) {
        labels[static_cast<std::size_t>(in_slab)] = static_cast<std::int32_t>(value);
        continue;
      }
      const auto at = static_cast<std::size_t>(in_slab * features + feature++);
      if (dtype == DType::u8)
        bytes[at] = static_cast<std::uint8_t>(value);
      else
        floats[at] = static_cast<float>(value);
    }
    if (++in_slab == slab) flush();
  }
  flush();
  MPT_REQUIRE(writer.written() == layout.rows,
              where + " changed while it was converted (" + std::to_string(writer.written()) +
                  " of " + std::to_string(layout.rows) + " rows on the second read)",
              "convert a file nothing else is writing");
  writer.finish(detail::converted_attributes(options, layout.max_label, dtype, statistics,
                                             "csv: '" + csv_path + "'"));
}

}  // namespace mpt::data
