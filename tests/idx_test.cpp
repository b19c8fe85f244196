#include <gtest/gtest.h>
#include <zlib.h>

#include "cohort/core/error.hpp"
#include "cohort/data/idx.hpp"
#include "helpers.hpp"

using namespace cohort;
using cohort::test::TempDir;
using cohort::test::write_file;

namespace {

std::string idx_bytes(uint8_t dtype, const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data) {
  std::string s = {0, 0, static_cast<char>(dtype), static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift : {24, 16, 8, 0}) s += static_cast<char>((d >> shift) & 0xFF);
  }
  s.append(data.begin(), data.end());
  return s;
}

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

std::string error_of(const std::string& path) {
  try {
    read_idx(path);
  } catch (const DataError& e) {
    EXPECT_EQ(e.exit_code(), 1);
    return e.what();
  }
  return "(no error)";
}

// 3 images of 2x3 with pixel value image*10 + position; labels 2, 0, 1.
void write_tiny_split(const TempDir& dir, const std::string& prefix, bool gz) {
  std::vector<uint8_t> pixels;
  for (int i = 0; i < 3; ++i)
    for (int p = 0; p < 6; ++p) pixels.push_back(static_cast<uint8_t>(i * 10 + p));
  auto images = idx_bytes(0x08, {3, 2, 3}, pixels);
  auto labels = idx_bytes(0x08, {3}, {2, 0, 1});
  std::string suffix = gz ? ".gz" : "";
  auto write = gz ? write_gz : write_file;
  write(dir / (prefix + "-images-idx3-ubyte" + suffix), images);
  write(dir / (prefix + "-labels-idx1-ubyte" + suffix), labels);
}

}  // namespace

TEST(Idx, ReadsPlainAndGzipIdentically) {
  TempDir tmp;
  std::vector<uint8_t> data = {1, 2, 3, 4, 5, 250};
  write_file(tmp / "a.idx", idx_bytes(0x08, {2, 3}, data));
  write_gz(tmp / "a.idx.gz", idx_bytes(0x08, {2, 3}, data));
  for (const std::string& p : {tmp / "a.idx", tmp / "a.idx.gz"}) {
    IdxArray a = read_idx(p);
    ASSERT_EQ(a.dims, (std::vector<int64_t>{2, 3}));
    ASSERT_EQ(a.data.sizes(), (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(a.data[1][2].item<uint8_t>(), 250);
    EXPECT_EQ(a.data[0][0].item<uint8_t>(), 1);
  }
}

TEST(Idx, ImageDatasetShapesAndLabels) {
  TempDir tmp;
  write_tiny_split(tmp, "train", /*gz=*/true);
  write_tiny_split(tmp, "t10k", /*gz=*/false);
  for (const char* split : {"train", "test"}) {
    ImageDataset ds = ImageDataset::load(tmp.path(), split);
    ASSERT_EQ(ds.size(), 3);
    EXPECT_EQ(ds.height(), 2);
    EXPECT_EQ(ds.width(), 3);
    EXPECT_EQ(ds.num_classes(), 3);
    Example ex = ds.get(2);
    EXPECT_EQ(ex.at("image").sizes(), (std::vector<int64_t>{1, 2, 3}));
    EXPECT_EQ(ex.at("label").item<int64_t>(), 1);
    // Pixel 25 of image 2 (position 5) normalised with Fashion-MNIST's mean/std.
    EXPECT_NEAR(ex.at("image")[0][1][2].item<float>(), (25.0f / 255 - 0.2860f) / 0.3530f, 1e-6);
  }
  EXPECT_THROW(ImageDataset::load(tmp.path(), "valid"), ConfigError);
}

TEST(Idx, MissingFileNamesThePath) {
  TempDir tmp;
  EXPECT_NE(error_of(tmp / "nope.idx").find(tmp / "nope.idx"), std::string::npos);
  try {
    ImageDataset::load(tmp.path(), "train");
    FAIL();
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("train-images-idx3-ubyte"), std::string::npos) << e.what();
  }
}

TEST(Idx, TruncatedDataIsReportedWithByteCounts) {
  TempDir tmp;
  std::string bytes = idx_bytes(0x08, {4, 5}, std::vector<uint8_t>(20, 7));
  write_gz(tmp / "t.gz", bytes.substr(0, bytes.size() - 3));
  std::string msg = error_of(tmp / "t.gz");
  EXPECT_NE(msg.find(tmp / "t.gz"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  EXPECT_NE(msg.find("20"), std::string::npos) << msg;
  EXPECT_NE(msg.find("17"), std::string::npos) << msg;

  write_file(tmp / "h", std::string("\0\0\x08", 3));
  EXPECT_NE(error_of(tmp / "h").find("truncated"), std::string::npos);
}

// A download cut off mid-stream: the gzip file itself is short, and the
// message still counts the data bytes (not just "corrupt").
TEST(Idx, GzipCutMidStreamIsReportedWithByteCounts) {
  TempDir tmp;
  std::vector<uint8_t> data(4000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>((i * 7919) >> 3);
  write_gz(tmp / "whole.gz", idx_bytes(0x08, {40, 100}, data));
  std::string gz = cohort::test::read_file(tmp / "whole.gz");
  write_file(tmp / "cut.gz", gz.substr(0, gz.size() / 2));
  std::string msg = error_of(tmp / "cut.gz");
  EXPECT_NE(msg.find(tmp / "cut.gz"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated: header promises 4000 data bytes, file has"), std::string::npos) << msg;
}

// Uncompressed IDX under a .gz name (a file gunzipped in place, then
// renamed back) reads as it is, as zlib tools read it.
TEST(Idx, PlainContentUnderAGzNameIsRead) {
  TempDir tmp;
  std::vector<uint8_t> data = {1, 2, 3, 4, 5, 6};
  write_file(tmp / "p.gz", idx_bytes(0x08, {2, 3}, data));
  IdxArray a = cohort::read_idx(tmp / "p.gz");
  ASSERT_EQ(a.dims, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a.data[1][2].item<int>(), 6);
}

TEST(Idx, BadHeaderAndTrailingBytes) {
  TempDir tmp;
  write_file(tmp / "magic", "PK\x03\x04 not an idx file at all");
  EXPECT_NE(error_of(tmp / "magic").find("not an IDX file"), std::string::npos);

  write_file(tmp / "dtype", idx_bytes(0x0D, {1}, {0, 0, 0, 0}));
  EXPECT_NE(error_of(tmp / "dtype").find("float32"), std::string::npos);

  write_file(tmp / "extra", idx_bytes(0x08, {2}, {1, 2, 3}));
  EXPECT_NE(error_of(tmp / "extra").find("after"), std::string::npos);

  write_file(tmp / "zero", idx_bytes(0x08, {0}, {}));
  EXPECT_NE(error_of(tmp / "zero").find("dimension 0"), std::string::npos);
}

TEST(Idx, CorruptGzipIsReported) {
  TempDir tmp;
  std::string good = idx_bytes(0x08, {64, 64}, std::vector<uint8_t>(4096, 3));
  write_gz(tmp / "c.gz", good);
  std::string gz = cohort::test::read_file(tmp / "c.gz");
  for (size_t i = 20; i < gz.size() - 8; ++i) gz[i] = static_cast<char>(gz[i] ^ 0x5A);
  write_file(tmp / "c.gz", gz);
  std::string msg = error_of(tmp / "c.gz");
  EXPECT_NE(msg.find(tmp / "c.gz"), std::string::npos) << msg;
  EXPECT_NE(msg.find("corrupt"), std::string::npos) << msg;
}

TEST(Idx, ImageAndLabelCountsMustAgree) {
  TempDir tmp;
  write_tiny_split(tmp, "train", false);
  write_file(tmp / "train-labels-idx1-ubyte", idx_bytes(0x08, {2}, {0, 1}));
  try {
    ImageDataset::load(tmp.path(), "train");
    FAIL();
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("3 images"), std::string::npos) << e.what();
  }
}

// Hardening: a stray label (200 among 0..3) was read as a 201-class
// dataset; a test label outside the training classes failed inside torch.
TEST(Idx, StrayLabelIsRefused) {
  TempDir tmp;
  cohort::test::write_tiny_dataset(tmp);
  std::string labels = cohort::test::read_file(tmp / "train-labels-idx1-ubyte");
  labels[labels.size() - 3] = static_cast<char>(200);
  write_file(tmp / "train-labels-idx1-ubyte", labels);
  try {
    ImageDataset::load(tmp.path(), "train");
    ADD_FAILURE() << "a 201-class dataset was accepted";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("label 200 (at index 5) implies 201 classes, but class 4"), std::string::npos)
        << e.what();
  }
  cohort::test::write_tiny_dataset(tmp);
  std::string test_labels = cohort::test::read_file(tmp / "t10k-labels-idx1-ubyte");
  test_labels.back() = 9;
  write_file(tmp / "t10k-labels-idx1-ubyte", test_labels);
  auto r = cohort::test::run_cohort("train --model.name mlp --model.hidden 8 --train.max-steps 1 --data.global-batch 4 "
                                    "--quiet --data.path " + tmp.path() + " --out " + (tmp / "run"));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("a label of 9 is outside the training set's 4 classes"), std::string::npos) << r.err;
}

TEST(Idx, RealFashionMnist) {
  if (!cohort::test::have_fashion_mnist()) GTEST_SKIP() << "SKIPPED: dataset-fashion-mnist is not installed";
  ImageDataset train = ImageDataset::load("/usr/share/datasets/fashion-mnist", "train");
  ImageDataset test = ImageDataset::load("/usr/share/datasets/fashion-mnist", "test");
  EXPECT_EQ(train.size(), 60000);
  EXPECT_EQ(test.size(), 10000);
  EXPECT_EQ(train.height(), 28);
  EXPECT_EQ(train.num_classes(), 10);
  // Fashion-MNIST is balanced: 6000 training and 1000 test images per class.
  std::vector<int> counts(10);
  for (int64_t i = 0; i < test.size(); ++i) counts[test.get(i).at("label").item<int64_t>()]++;
  for (int c : counts) EXPECT_EQ(c, 1000);
}
