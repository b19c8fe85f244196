#include "cohort/data/idx.hpp"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <sys/stat.h>

#include "cohort/core/error.hpp"
#include "cohort/core/gz_file.hpp"

namespace cohort {

namespace {

const char* dtype_name(int code) {
  switch (code) {
    case 0x08: return "uint8";
    case 0x09: return "int8";
    case 0x0B: return "int16";
    case 0x0C: return "int32";
    case 0x0D: return "float32";
    case 0x0E: return "float64";
    default: return "unknown";
  }
}

// The data bytes, as many as there are: a compressed stream cut short
// counts as a short file (the caller names both counts), not as corrupt.
size_t read_data(gzFile f, const std::string& path, char* dst, size_t n) {
  size_t got = 0;
  try {
    while (got < n) {
      size_t r = gz_read_some(f, path, dst + got, n - got);
      if (r == 0) break;
      got += r;
    }
  } catch (const DataError&) {
    if (!gz_cut_short(f)) throw;
  }
  return got;
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  GzFile f = open_gz_input(path, GzSuffix::kAnyContent);

  unsigned char head[4];
  size_t got = gz_read_full(f.get(), path, head, 4);
  COHORT_CHECK(got == 4, DataError, path, ": truncated: ", got, " bytes, too short for an IDX header");
  COHORT_CHECK(head[0] == 0 && head[1] == 0, DataError, path,
               ": not an IDX file (magic bytes ", int(head[0]), ",", int(head[1]), ", expected 0,0)");
  COHORT_CHECK(head[2] == 0x08, DataError, path, ": IDX dtype 0x", std::hex, int(head[2]), std::dec,
               " (", dtype_name(head[2]), ") is not supported; expected 0x08 (uint8)");
  int ndims = head[3];
  COHORT_CHECK(ndims >= 1 && ndims <= 4, DataError, path, ": IDX dimension count ", ndims,
               " is out of range [1, 4]");

  IdxArray out;
  int64_t total = 1;
  for (int d = 0; d < ndims; ++d) {
    unsigned char b[4];
    got = gz_read_full(f.get(), path, b, 4);
    COHORT_CHECK(got == 4, DataError, path, ": truncated in the header (dimension ", d, ")");
    int64_t dim = (int64_t(b[0]) << 24) | (int64_t(b[1]) << 16) | (int64_t(b[2]) << 8) | int64_t(b[3]);
    COHORT_CHECK(dim >= 1 && dim < (int64_t(1) << 31), DataError, path, ": dimension ", d,
                 " has size ", dim);
    out.dims.push_back(dim);
    COHORT_CHECK(total <= ((int64_t(1) << 40) - 1) / dim, DataError, path, ": implausibly large (",
                 total, " x ", dim, " elements)");
    total *= dim;
  }

  // The header is not trusted with an allocation: the file must be able to
  // hold what it promises (deflate expands at most ~1032:1). Found by fuzz/:
  // a 20-byte file asked for 32 GiB.
  struct stat st{};
  COHORT_CHECK(::stat(path.c_str(), &st) == 0, DataError, path, ": cannot stat (", std::strerror(errno), ")");
  const bool compressed = gzdirect(f.get()) == 0;
  const int64_t header = 4 + 4 * static_cast<int64_t>(ndims);
  const int64_t room = compressed ? static_cast<int64_t>(st.st_size) * 1032 : static_cast<int64_t>(st.st_size) - header;
  COHORT_CHECK(total <= room, DataError, path, ": truncated: header promises ", total, " data bytes, file has ",
               compressed ? detail::cat("at most ", room, " (compressed)") : detail::cat(room));
  out.data = torch::empty(out.dims, torch::kUInt8);
  got = read_data(f.get(), path, static_cast<char*>(out.data.data_ptr()), static_cast<size_t>(total));
  COHORT_CHECK(got == static_cast<size_t>(total), DataError, path, ": truncated: header promises ",
               total, " data bytes, file has ", got);
  char extra;
  COHORT_CHECK(gz_read_full(f.get(), path, &extra, 1) == 0, DataError, path,
               ": has bytes after the ", total, " the header promises; is it the right file?");
  return out;
}

std::string find_idx(const std::string& dir, const std::string& stem) {
  struct stat st;
  for (const std::string& p : {dir + "/" + stem + ".gz", dir + "/" + stem}) {
    if (::stat(p.c_str(), &st) == 0) return p;
  }
  throw DataError(detail::cat(dir, "/", stem, "[.gz]: no such file. Is data.path right? "
                              "(Fashion-MNIST comes with: apt-get install dataset-fashion-mnist)"));
}

ImageDataset ImageDataset::load(const std::string& dir, const std::string& split) {
  std::string prefix;
  if (split == "train") prefix = "train";
  else if (split == "test") prefix = "t10k";
  else throw ConfigError(detail::cat("split '", split, "' is not one of train | test for an IDX image dataset"));
  std::string images = find_idx(dir, prefix + "-images-idx3-ubyte");
  std::string labels = find_idx(dir, prefix + "-labels-idx1-ubyte");
  IdxArray im = read_idx(images);
  IdxArray lb = read_idx(labels);
  COHORT_CHECK(im.dims.size() == 3, DataError, images, ": expected 3 dimensions [N,H,W], got ", im.dims.size());
  COHORT_CHECK(lb.dims.size() == 1, DataError, labels, ": expected 1 dimension [N], got ", lb.dims.size());
  COHORT_CHECK(im.dims[0] == lb.dims[0], DataError, images, " has ", im.dims[0], " images but ", labels,
               " has ", lb.dims[0], " labels");
  ImageDataset out(std::move(im), std::move(lb), dir + " (" + split + ")");
  if (split == "train" && out.size() > 0) {
    // The model gets max label + 1 classes: one stray label (200 among
    // 0..9) would silently make a 201-class model. Every class must occur.
    auto counts = torch::bincount(out.labels_);
    auto empty = counts.eq(0).nonzero();
    if (empty.numel() > 0) {
      int64_t top = out.num_classes_ - 1;
      int64_t at = out.labels_.eq(top).nonzero()[0][0].item<int64_t>();
      throw DataError(detail::cat(labels, ": label ", top, " (at index ", at, ") implies ", top + 1,
                                  " classes, but class ", empty[0][0].item<int64_t>(), " and ", empty.numel() - 1,
                                  " other(s) below it never occur; labels must be 0..K-1 with every class present"));
    }
  }
  return out;
}

ImageDataset::ImageDataset(IdxArray images, IdxArray labels, std::string origin)
    : images_(std::move(images.data)), labels_(labels.data.to(torch::kInt64)), origin_(std::move(origin)) {
  num_classes_ = labels_.numel() ? labels_.max().item<int64_t>() + 1 : 0;
}

namespace {
// uint8 pixels -> float, normalised with Fashion-MNIST's training mean and std.
torch::Tensor normalise(const torch::Tensor& pixels) {
  constexpr float kMean = 0.2860f, kStd = 0.3530f;
  return pixels.to(torch::kFloat32).mul_(1.0f / (255.0f * kStd)).sub_(kMean / kStd);
}
}  // namespace

Example ImageDataset::get(int64_t index) const {
  return {{"image", normalise(images_[index]).unsqueeze(0)}, {"label", labels_[index]}};
}

// One index_select per field instead of a tensor op per sample: gathering a
// batch of 64 drops from ~20 ms to well under 1 ms.
Example ImageDataset::get_batch(const std::vector<int64_t>& indices) const {
  auto idx = torch::tensor(indices, torch::kInt64);
  return {{"image", normalise(images_.index_select(0, idx)).unsqueeze(1)}, {"label", labels_.index_select(0, idx)}};
}

std::string ImageDataset::describe() const {
  return detail::cat(origin_, ": ", size(), " images ", height(), "x", width(), ", ", num_classes_, " classes");
}

}  // namespace cohort
