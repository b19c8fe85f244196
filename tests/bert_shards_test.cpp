#include <gtest/gtest.h>
#include <hdf5.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <numeric>
#include <random>
#include <thread>

#include "cohort/core/error.hpp"
#include "cohort/data/bert_shards.hpp"
#include "helpers.hpp"

using namespace cohort;
using cohort::test::TempDir;
using cohort::test::write_file;

namespace {

namespace fs = std::filesystem;

// The message of the DataError `fn` throws, or "(no DataError)".
std::string data_error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const DataError& e) {
    EXPECT_EQ(e.exit_code(), 1);
    return e.what();
  } catch (const std::exception& e) {
    return std::string("(not a DataError) ") + e.what();
  }
  return "(no DataError)";
}

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << (msg)

// Row g of a test shard encodes its global index g: input_ids[j] = g*1000 + j
// for the real tokens, real length 1 + g % L, masked positions 1..k (k = g % P,
// so some rows have none), masked ids g + position, next sentence g % 2.
BertRows make_rows(int64_t first, int64_t n, int64_t l = 8, int64_t p = 3) {
  BertRows rows;
  rows.seq_len = l;
  rows.max_predictions = p;
  for (int64_t g = first; g < first + n; ++g) {
    int64_t len = 1 + g % l;
    for (int64_t j = 0; j < l; ++j) {
      rows.input_ids.push_back(j < len ? static_cast<int32_t>(g * 1000 + j) : 0);
      rows.input_mask.push_back(j < len ? 1 : 0);
      rows.segment_ids.push_back(j < len && j >= len / 2 ? 1 : 0);
    }
    int64_t k = std::min<int64_t>(g % p, len - 1);
    for (int64_t j = 0; j < p; ++j) {
      rows.masked_lm_positions.push_back(j < k ? static_cast<int32_t>(j + 1) : 0);
      // Garbage past the first 0 position, as some writers leave it.
      rows.masked_lm_ids.push_back(j < k ? static_cast<int32_t>(g + j + 1) : 7);
    }
    rows.next_sentence_labels.push_back(static_cast<int8_t>(g % 2));
  }
  return rows;
}

int64_t real_len(int64_t g, int64_t l = 8) { return 1 + g % l; }

// Checks batch row b against global row g of make_rows().
void expect_row(const Example& batch, int64_t b, int64_t g, int64_t l = 8, int64_t p = 3) {
  int64_t width = batch.at("input_ids").size(1);
  auto ids = batch.at("input_ids")[b], mask = batch.at("input_mask")[b], seg = batch.at("segment_ids")[b];
  int64_t len = real_len(g, l);
  for (int64_t j = 0; j < width; ++j) {
    ASSERT_EQ(ids[j].item<int64_t>(), j < len ? g * 1000 + j : 0) << "row " << g << " column " << j;
    ASSERT_EQ(mask[j].item<int64_t>(), j < len ? 1 : 0) << "row " << g;
    ASSERT_EQ(seg[j].item<int64_t>(), j < len && j >= len / 2 ? 1 : 0) << "row " << g;
  }
  int64_t k = std::min<int64_t>(g % p, len - 1);
  for (int64_t j = 0; j < p; ++j) {
    ASSERT_EQ(batch.at("masked_lm_positions")[b][j].item<int64_t>(), j < k ? j + 1 : 0) << "row " << g;
    ASSERT_EQ(batch.at("masked_lm_ids")[b][j].item<int64_t>(), j < k ? g + j + 1 : -1) << "row " << g;
  }
  ASSERT_EQ(batch.at("next_sentence_labels")[b].item<int64_t>(), g % 2);
}

// --- raw HDF5 files, for layouts Cohort's writer never makes ----------------------

struct RawSet {
  std::string name;
  std::vector<hsize_t> dims;
  hid_t type;                     // stored and in-memory type (a native type)
  std::vector<int64_t> values{};  // converted to `type`; zeros when empty
};

// NVIDIA's six datasets, N rows, stored as `type`, all zeros.
std::vector<RawSet> layout(hsize_t n, hsize_t l, hsize_t p, hid_t type = H5T_NATIVE_INT32) {
  return {{"input_ids", {n, l}, type},          {"input_mask", {n, l}, type},
          {"segment_ids", {n, l}, type},        {"masked_lm_positions", {n, p}, type},
          {"masked_lm_ids", {n, p}, type},      {"next_sentence_labels", {n}, type}};
}

RawSet& set_named(std::vector<RawSet>& sets, const std::string& name) {
  for (auto& s : sets)
    if (s.name == name) return s;
  throw std::runtime_error("no set " + name);
}

void write_raw(const std::string& path, const std::vector<RawSet>& sets) {
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(f, 0) << path;
  for (const auto& s : sets) {
    hsize_t count = 1;
    for (hsize_t d : s.dims) count *= d;
    std::vector<int64_t> v = s.values.empty() ? std::vector<int64_t>(count, 0) : s.values;
    ASSERT_EQ(v.size(), count) << s.name;
    hid_t space = H5Screate_simple(static_cast<int>(s.dims.size()), s.dims.data(), nullptr);
    hid_t d = H5Dcreate2(f, s.name.c_str(), s.type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(d, 0) << s.name;
    // HDF5 converts the int64 values to the stored type (float included).
    if (count > 0) {
      ASSERT_GE(H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), 0) << s.name;
    }
    H5Dclose(d);
    H5Sclose(space);
  }
  H5Fclose(f);
}

template <class T>
std::vector<int64_t> widen(const std::vector<T>& v) {
  return std::vector<int64_t>(v.begin(), v.end());
}

// A HetSeq-style shard: the same rows as make_rows, every dataset int64.
void write_int64_shard(const std::string& path, const BertRows& r) {
  auto n = static_cast<hsize_t>(r.rows()), l = static_cast<hsize_t>(r.seq_len),
       p = static_cast<hsize_t>(r.max_predictions);
  auto sets = layout(n, l, p, H5T_NATIVE_INT64);
  sets[0].values = widen(r.input_ids);
  sets[1].values = widen(r.input_mask);
  sets[2].values = widen(r.segment_ids);
  sets[3].values = widen(r.masked_lm_positions);
  sets[4].values = widen(r.masked_lm_ids);
  sets[5].values = widen(r.next_sentence_labels);
  write_raw(path, sets);
}

// Size in bits and signedness of a dataset's stored type, and whether it is
// gzip-compressed.
struct Stored {
  size_t bits = 0;
  bool deflate = false;
  std::vector<hsize_t> dims;
};
Stored stored(const std::string& path, const char* name) {
  Stored s;
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
  hid_t t = H5Dget_type(d);
  s.bits = H5Tget_size(t) * 8;
  EXPECT_EQ(H5Tget_class(t), H5T_INTEGER) << name;
  hid_t dcpl = H5Dget_create_plist(d);
  for (int i = 0; i < H5Pget_nfilters(dcpl); ++i) {
    unsigned flags = 0;
    size_t nelem = 0;
    unsigned config = 0;
    if (H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &nelem, nullptr, 0, nullptr, &config) ==
        H5Z_FILTER_DEFLATE)
      s.deflate = true;
  }
  hid_t space = H5Dget_space(d);
  s.dims.resize(static_cast<size_t>(H5Sget_simple_extent_ndims(space)));
  H5Sget_simple_extent_dims(space, s.dims.data(), nullptr);
  H5Sclose(space);
  H5Pclose(dcpl);
  H5Tclose(t);
  H5Dclose(d);
  H5Fclose(f);
  return s;
}

}  // namespace

TEST(BertShards, WritesNvidiaLayout) {
  TempDir tmp;
  const std::string path = tmp / "part-00000.hdf5";
  write_bert_shard(path, make_rows(0, 300, 8, 3));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  struct Want {
    const char* name;
    size_t bits;
    std::vector<hsize_t> dims;
  };
  for (const Want& w : {Want{"input_ids", 32, {300, 8}}, Want{"input_mask", 8, {300, 8}},
                        Want{"segment_ids", 8, {300, 8}}, Want{"masked_lm_positions", 32, {300, 3}},
                        Want{"masked_lm_ids", 32, {300, 3}}, Want{"next_sentence_labels", 8, {300}}}) {
    Stored s = stored(path, w.name);
    EXPECT_EQ(s.bits, w.bits) << w.name;
    EXPECT_EQ(s.dims, w.dims) << w.name;
    EXPECT_TRUE(s.deflate) << w.name;
  }
}

TEST(BertShards, RoundTrip) {
  TempDir tmp;
  fs::create_directories(tmp / "train");
  write_bert_shard(tmp / "train/part-00000.hdf5", make_rows(0, 11));
  BertShards ds(tmp.path(), "train");
  EXPECT_EQ(ds.size(), 11);
  EXPECT_EQ(ds.info().files, 1);
  EXPECT_EQ(ds.info().seq_len, 8);
  EXPECT_EQ(ds.info().max_predictions, 3);
  EXPECT_EQ(ds.info().vocab_size, -1);
  EXPECT_HAS(ds.describe(), "BERT shards: 1 files, 11 rows, L=8, P=3 under " + tmp.path() + " (split train)");

  // One row: the full L, scalars for the label.
  Example one = ds.get(5);
  EXPECT_EQ(one.size(), 6u);
  for (const auto& [name, t] : one) EXPECT_EQ(t.scalar_type(), torch::kInt64) << name;
  EXPECT_EQ(one.at("input_ids").sizes(), (std::vector<int64_t>{8}));
  EXPECT_EQ(one.at("masked_lm_ids").sizes(), (std::vector<int64_t>{3}));
  EXPECT_EQ(one.at("next_sentence_labels").dim(), 0);
  Example as_batch;
  for (const auto& [name, t] : one) as_batch[name] = t.unsqueeze(0);
  expect_row(as_batch, 0, 5);
  // Row 5: positions 1, 2, then 0 padding: its id is -1, not the stored 7.
  EXPECT_TRUE(torch::equal(one.at("masked_lm_ids"), torch::tensor({6, 7, -1}, torch::kInt64)));

  // A batch is trimmed to its longest real row: rows 1, 2 and 4 have lengths
  // 2, 3 and 5.
  Example b = ds.get_batch({4, 1, 2});
  for (const auto& [name, t] : b) EXPECT_EQ(t.scalar_type(), torch::kInt64) << name;
  EXPECT_EQ(b.at("input_ids").sizes(), (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(b.at("input_mask").sizes(), (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(b.at("segment_ids").sizes(), (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(b.at("masked_lm_positions").sizes(), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(b.at("masked_lm_ids").sizes(), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(b.at("next_sentence_labels").sizes(), (std::vector<int64_t>{3}));
  expect_row(b, 0, 4);
  expect_row(b, 1, 1);
  expect_row(b, 2, 2);
  // Row 0 has no masked positions at all: every id is -1.
  EXPECT_TRUE(torch::equal(ds.get_batch({0}).at("masked_lm_ids"), torch::full({1, 3}, -1, torch::kInt64)));
  EXPECT_EQ(ds.get_batch({0}).at("input_ids").sizes(), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(ds.get_batch({7, 0}).at("input_ids").sizes(), (std::vector<int64_t>{2, 8}));

  for (int64_t g = 0; g < 11; ++g) EXPECT_EQ(ds.length(g), real_len(g)) << g;
  EXPECT_THROW(ds.get(11), Error);
  EXPECT_THROW(ds.get_batch({0, -1}), Error);
}

TEST(BertShards, ManifestVocabSize) {
  TempDir tmp;
  fs::create_directories(tmp / "valid");
  write_bert_shard(tmp / "valid/part-00000.hdf5", make_rows(0, 4));
  write_file(tmp / "manifest.json", R"({"vocab_size": 30522, "max_seq_length": 8})");
  BertShards ds(tmp.path(), "valid");
  EXPECT_EQ(ds.info().vocab_size, 30522);
  EXPECT_HAS(ds.describe(), "vocab 30522");

  write_file(tmp / "manifest.json", "{not json");
  std::string msg = data_error_of([&] { BertShards(tmp.path(), "valid"); });
  EXPECT_HAS(msg, tmp / "manifest.json");

  // Token ids the vocabulary cannot hold fail when their block is read,
  // naming file, key and row.
  write_file(tmp / "manifest.json", R"({"vocab_size": 2500})");
  BertShardsOptions o;
  o.block_rows = 2;
  BertShards small(tmp.path(), "valid", o);
  EXPECT_NO_THROW(small.get(1));  // rows 0 and 1: ids below 1008
  msg = data_error_of([&] { small.get(3); });
  EXPECT_HAS(msg, tmp / "valid/part-00000.hdf5");
  EXPECT_HAS(msg, "'input_ids' row 3");
  EXPECT_HAS(msg, "3000");
}

TEST(BertShards, ShardFilesBothLayouts) {
  TempDir tmp;
  // DIR/<split>/*.hdf5|*.h5, sorted; other files and unfinished writes ignored.
  fs::create_directories(tmp / "nested/train");
  for (const char* name : {"b.hdf5", "a.h5", "notes.txt", "c.hdf5.tmp"})
    write_file(tmp / ("nested/train/" + std::string(name)), "x");
  fs::create_directories(tmp / "nested/train/sub.hdf5");
  EXPECT_EQ(shard_files(tmp / "nested", "train"),
            (std::vector<std::string>{tmp / "nested/train/a.h5", tmp / "nested/train/b.hdf5"}));

  // NVIDIA's flat layout: the split's name in the file name.
  fs::create_directories(tmp / "flat");
  for (const char* name : {"wiki_training_1.hdf5", "wiki_training_0.hdf5", "wiki_test_0.hdf5", "manifest.json",
                           "train_extra.hdf5"})
    write_file(tmp / ("flat/" + std::string(name)), "x");
  EXPECT_EQ(shard_files(tmp / "flat", "train"),
            (std::vector<std::string>{tmp / "flat/train_extra.hdf5", tmp / "flat/wiki_training_0.hdf5",
                                      tmp / "flat/wiki_training_1.hdf5"}));
  EXPECT_EQ(shard_files(tmp / "flat", "test"), (std::vector<std::string>{tmp / "flat/wiki_test_0.hdf5"}));

  std::string msg = data_error_of([&] { shard_files(tmp / "flat", "valid"); });
  EXPECT_HAS(msg, tmp / "flat");
  EXPECT_HAS(msg, "'valid'");
  EXPECT_HAS(msg, "wiki_test_0.hdf5");  // lists what is there
  msg = data_error_of([&] { shard_files(tmp / "nothing", "train"); });
  EXPECT_HAS(msg, tmp / "nothing");
  fs::create_directories(tmp / "nested/valid");
  msg = data_error_of([&] { shard_files(tmp / "nested", "valid"); });
  EXPECT_HAS(msg, "'valid'");
  EXPECT_HAS(msg, "nothing");
}

TEST(BertShards, ManyShardsMapGlobalIndices) {
  TempDir tmp;
  fs::create_directories(tmp / "train");
  // Sizes straddle the block size (64) and include an empty shard. Names sort
  // in this order.
  const std::vector<int64_t> sizes = {1, 300, 0, 17, 64, 513, 40};
  int64_t first = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "part-%05zu.hdf5", i);
    BertShardWriteOptions w;
    w.chunk_rows = 1 + static_cast<int64_t>(i) * 37;  // chunks unaligned with blocks
    write_bert_shard(tmp / ("train/" + std::string(name)), make_rows(first, sizes[i]), w);
    first += sizes[i];
  }
  BertShardsOptions o;
  o.block_rows = 64;
  o.cache_blocks = 3;
  o.open_files = 2;
  BertShards ds(tmp.path(), "train", o);
  ASSERT_EQ(ds.size(), first);
  EXPECT_EQ(ds.info().files, 7);
  for (int64_t g = 0; g < ds.size(); g += 7) {
    Example one = ds.get(g);
    ASSERT_EQ(one.at("input_ids")[0].item<int64_t>(), g * 1000) << g;
    ASSERT_EQ(one.at("next_sentence_labels").item<int64_t>(), g % 2) << g;
  }
  std::vector<int64_t> all(static_cast<size_t>(ds.size()));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), std::mt19937_64(7));
  for (size_t s = 0; s < all.size(); s += 97) {
    const size_t end = std::min(s + 97, all.size());
    std::vector<int64_t> idx(all.begin() + static_cast<long>(s), all.begin() + static_cast<long>(end));
    Example b = ds.get_batch(idx);
    for (size_t i = 0; i < idx.size(); ++i) expect_row(b, static_cast<int64_t>(i), idx[i]);
  }
  for (int64_t g = ds.size() - 1; g >= 0; g -= 5) ASSERT_EQ(ds.length(g), real_len(g)) << g;

  // Blocks sized by each file's own chunks (the default).
  BertShards own(tmp.path(), "train");
  Example b = own.get_batch(all);
  for (size_t i = 0; i < all.size(); ++i) expect_row(b, static_cast<int64_t>(i), all[i]);
}

TEST(BertShards, ConcurrentBatchesMatchSequential) {
  TempDir tmp;
  fs::create_directories(tmp / "train");
  int64_t first = 0;
  for (int i = 0; i < 5; ++i) {
    write_bert_shard(tmp / ("train/part-" + std::to_string(i) + ".hdf5"), make_rows(first, 200 + 50 * i));
    first += 200 + 50 * i;
  }
  BertShardsOptions o;
  o.block_rows = 32;
  o.cache_blocks = 4;  // small: threads evict each other's blocks
  o.open_files = 3;
  BertShards ds(tmp.path(), "train", o);
  std::mt19937_64 rng(1);
  std::vector<std::vector<int64_t>> batches(30);
  for (auto& b : batches)
    for (int i = 0; i < 24; ++i) b.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(ds.size())));
  std::vector<Example> want;
  for (const auto& b : batches) want.push_back(ds.get_batch(b));

  std::vector<std::vector<Example>> got(4);
  cohort::test::spawn(4, [&](int t) {
    for (int rep = 0; rep < 2; ++rep)
      for (size_t i = static_cast<size_t>(t); i < batches.size(); i += 2)  // overlapping halves
        got[static_cast<size_t>(t)].push_back(ds.get_batch(batches[i]));
    for (size_t i = 0; i < batches.size(); i += 3) ds.length(batches[i][0]);
  });
  for (int t = 0; t < 4; ++t) {
    size_t k = 0;
    for (int rep = 0; rep < 2; ++rep)
      for (size_t i = static_cast<size_t>(t); i < batches.size(); i += 2, ++k)
        for (const auto& [name, tensor] : want[i])
          ASSERT_TRUE(torch::equal(got[static_cast<size_t>(t)][k].at(name), tensor)) << name << " batch " << i;
  }
}

TEST(BertShards, HetSeqInt64FilesRead) {
  TempDir tmp;
  fs::create_directories(tmp / "train");
  write_int64_shard(tmp / "train/a.hdf5", make_rows(0, 20));
  write_bert_shard(tmp / "train/b.hdf5", make_rows(20, 10));  // mixed widths are fine
  BertShards ds(tmp.path(), "train");
  ASSERT_EQ(ds.size(), 30);
  std::vector<int64_t> idx(30);
  std::iota(idx.begin(), idx.end(), 0);
  Example b = ds.get_batch(idx);
  for (int64_t g = 0; g < 30; ++g) expect_row(b, g, g);
}

TEST(BertShards, WriterRejectsInconsistentRows) {
  TempDir tmp;
  BertRows rows = make_rows(0, 4);
  rows.segment_ids.pop_back();
  std::string msg = data_error_of([&] { write_bert_shard(tmp / "x.hdf5", rows); });
  EXPECT_HAS(msg, tmp / "x.hdf5");
  EXPECT_HAS(msg, "segment_ids has 31 values; expected 32");
  rows = make_rows(0, 4);
  rows.masked_lm_ids.push_back(1);
  EXPECT_HAS(data_error_of([&] { write_bert_shard(tmp / "x.hdf5", rows); }), "masked_lm_ids");
  rows = make_rows(0, 4);
  msg = data_error_of([&] { write_bert_shard(tmp / "no/such/dir/x.hdf5", rows); });
  EXPECT_HAS(msg, tmp / "no/such/dir/x.hdf5");
  EXPECT_FALSE(fs::exists(tmp / "x.hdf5"));
}

// Each bad file is reported as a DataError naming the file and the dataset.
class BertShardsBadFile : public ::testing::Test {
 protected:
  void SetUp() override { fs::create_directories(tmp / "train"); }
  // The error opening the split, with a good shard sorted before `bad`.
  std::string open_error() {
    write_bert_shard(tmp / "train/a-good.hdf5", make_rows(0, 6));
    testing::internal::CaptureStderr();
    std::string msg = data_error_of([&] { BertShards(tmp.path(), "train"); });
    std::string err = testing::internal::GetCapturedStderr();
    EXPECT_EQ(err, "") << "HDF5 printed its error stack";
    return msg;
  }
  std::string bad() const { return tmp / "train/b-bad.hdf5"; }
  TempDir tmp;
};

TEST_F(BertShardsBadFile, MissingKey) {
  auto sets = layout(6, 8, 3);
  sets.erase(sets.begin() + 2);
  write_raw(bad(), sets);
  std::string msg = open_error();
  EXPECT_HAS(msg, bad());
  EXPECT_HAS(msg, "'segment_ids' is missing");
  EXPECT_HAS(msg, "the file has: input_ids, input_mask, masked_lm_ids");
}

TEST_F(BertShardsBadFile, WrongRank) {
  auto sets = layout(6, 8, 3);
  set_named(sets, "input_mask").dims = {6, 8, 1};
  write_raw(bad(), sets);
  std::string msg = open_error();
  EXPECT_HAS(msg, bad());
  EXPECT_HAS(msg, "'input_mask' has rank 3 (shape [6,8,1]); expected rank 2 [N,L]");
}

TEST_F(BertShardsBadFile, MismatchedRows) {
  auto sets = layout(6, 8, 3);
  set_named(sets, "masked_lm_ids").dims = {5, 3};
  write_raw(bad(), sets);
  std::string msg = open_error();
  EXPECT_HAS(msg, bad());
  EXPECT_HAS(msg, "'masked_lm_ids' has 5 rows");
  EXPECT_HAS(msg, "expected N=6");
}

TEST_F(BertShardsBadFile, MismatchedColumns) {
  auto sets = layout(6, 8, 3);
  set_named(sets, "segment_ids").dims = {6, 7};
  write_raw(bad(), sets);
  std::string msg = open_error();
  EXPECT_HAS(msg, bad());
  EXPECT_HAS(msg, "'segment_ids' has 7 columns");
  EXPECT_HAS(msg, "expected L=8");
}

TEST_F(BertShardsBadFile, OtherSeqLenThanTheFirstShard) {
  write_raw(bad(), layout(6, 16, 3));
  std::string msg = open_error();
  EXPECT_HAS(msg, bad());
  EXPECT_HAS(msg, "'input_ids' has L=16");
  EXPECT_HAS(msg, tmp / "train/a-good.hdf5");
}

TEST_F(BertShardsBadFile, FloatDtype) {
  auto sets = layout(6, 8, 3);
  set_named(sets, "input_ids").type = H5T_NATIVE_FLOAT;
  write_raw(bad(), sets);
  std::string msg = open_error();
  EXPECT_HAS(msg, bad());
  EXPECT_HAS(msg, "'input_ids' has dtype float (32-bit); expected an integer dtype");
}

TEST_F(BertShardsBadFile, Truncated) {
  write_bert_shard(bad(), make_rows(0, 2000));
  std::string bytes = cohort::test::read_file(bad());
  write_file(bad(), bytes.substr(0, bytes.size() / 2));
  std::string msg = open_error();
  // Truncation is found on opening the file, before any dataset is read.
  EXPECT_HAS(msg, bad());
  EXPECT_HAS(msg, "truncated");
}

TEST_F(BertShardsBadFile, NotHdf5) {
  write_file(bad(), "input_ids,input_mask\n1,2\n");
  std::string msg = open_error();
  EXPECT_HAS(msg, bad());
  EXPECT_HAS(msg, "not a readable HDF5 file (file signature not found)");
}

// Hardening (found by fuzz/): these two 5 KB files crash libhdf5 1.10.8
// itself, in H5Lexists (a null from a huge malloc, unchecked) and in
// H5Dread (a data address flipped to 0). They are one-line errors instead of
// a SIGSEGV with no message.
TEST_F(BertShardsBadFile, FilesThatCrashLibhdf5AreErrors) {
  const std::string corpus = std::string(COHORT_SOURCE_DIR) + "/fuzz/corpus/hdf5_shard/";
  write_file(bad(), cohort::test::read_file(corpus + "found-libhdf5-null-malloc-in-H5Lexists"));
  std::string msg = open_error();
  EXPECT_HAS(msg, bad());
  // (Segmentation fault), or exit code 1 where ASan reports it first.
  EXPECT_HAS(msg, "libhdf5 crashed reading this file (");
  EXPECT_HAS(msg, "): it is corrupt");
  write_file(bad(), cohort::test::read_file(corpus + "found-libhdf5-reads-address-0"));
  msg = open_error();
  EXPECT_HAS(msg, bad());
  EXPECT_HAS(msg, "(corrupt)");
}

TEST_F(BertShardsBadFile, CorruptChunkFailsOnRead) {
  BertShardWriteOptions w;
  w.chunk_rows = 256;
  write_bert_shard(bad(), make_rows(0, 4000), w);
  // Where input_ids' chunk 3 (rows 768..1023) lies in the file.
  haddr_t addr = 0;
  hsize_t size = 0;
  {
    hid_t f = H5Fopen(bad().c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, "input_ids", H5P_DEFAULT);
    hsize_t offset[2] = {0, 0};
    unsigned mask = 0;
    hid_t space = H5Dget_space(d);
    ASSERT_GE(H5Dget_chunk_info(d, space, 3, offset, &mask, &addr, &size), 0);
    ASSERT_EQ(offset[0], 768u);
    H5Sclose(space);
    H5Dclose(d);
    H5Fclose(f);
  }
  std::string bytes = cohort::test::read_file(bad());
  for (hsize_t i = addr + size / 4; i < addr + size * 3 / 4; ++i) bytes[i] = static_cast<char>(bytes[i] ^ 0x5A);
  write_file(bad(), bytes);
  write_bert_shard(tmp / "train/a-good.hdf5", make_rows(0, 6));

  BertShards ds(tmp.path(), "train");  // shapes are intact
  EXPECT_NO_THROW(ds.get(6 + 700));
  std::string msg = data_error_of([&] { ds.get(6 + 800); });
  EXPECT_HAS(msg, bad());
  EXPECT_HAS(msg, "rows 768..1023 of dataset 'input_ids'");
}

TEST_F(BertShardsBadFile, PositionPastTheSequenceFailsOnRead) {
  auto sets = layout(6, 8, 3);
  set_named(sets, "masked_lm_positions").values = {1, 2, 0, 1, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  write_raw(bad(), sets);
  write_bert_shard(tmp / "train/a-good.hdf5", make_rows(0, 6));
  BertShards ds(tmp.path(), "train");
  EXPECT_NO_THROW(ds.get(0));
  std::string msg = data_error_of([&] { ds.get(6); });
  EXPECT_HAS(msg, bad());
  EXPECT_HAS(msg, "'masked_lm_positions' row 1 column 1 holds 9; expected a position in [0, L=8)");
}
