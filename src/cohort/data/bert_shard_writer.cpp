#include <hdf5.h>

#include <algorithm>
#include <cstdio>

#include "cohort/core/error.hpp"
#include "cohort/core/files.hpp"
#include "cohort/data/bert_rows.hpp"
#include "cohort/data/hdf5_shard.hpp"

namespace cohort {

using namespace hdf5;

namespace {

void write_dataset(hid_t file, const std::string& path, Key key, const std::vector<hsize_t>& dims,
                   const void* data, const BertShardWriteOptions& opts) {
  const char* name = kKeyNames[key];
  hid_t file_type = kWide[key] ? H5T_STD_I32LE : H5T_STD_I8LE;
  hid_t mem_type = kWide[key] ? H5T_NATIVE_INT32 : H5T_NATIVE_INT8;
  auto fail = [&](const char* what) {
    return DataError(detail::cat(path, ": cannot ", what, " dataset '", name, "' (", hdf5_detail(), ")"));
  };

  H5Id space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
  H5Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (!space.ok() || !dcpl.ok()) throw fail("create");
  if (dims[0] > 0) {
    // Chunks of whole rows; at most 1 MiB so a chunk fits HDF5's default
    // per-dataset chunk cache.
    hsize_t row_bytes = (kWide[key] ? 4 : 1) * (dims.size() > 1 ? dims[1] : 1);
    hsize_t rows = std::min<hsize_t>({static_cast<hsize_t>(opts.chunk_rows), dims[0],
                                      std::max<hsize_t>(1, (hsize_t(1) << 20) / row_bytes)});
    std::vector<hsize_t> chunk = dims;
    chunk[0] = rows;
    bool ok = H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()) >= 0;
    if (ok && opts.gzip_level > 0) {
      ok = H5Pset_shuffle(dcpl.get()) >= 0 && H5Pset_deflate(dcpl.get(), static_cast<unsigned>(opts.gzip_level)) >= 0;
    }
    if (!ok) throw fail("set up compression for");
  }
  H5Id d(H5Dcreate2(file, name, file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), H5Dclose);
  if (!d.ok()) throw fail("create");
  if (dims[0] > 0 && H5Dwrite(d.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) throw fail("write");
}

}  // namespace

void write_bert_shard(const std::string& path, const BertRows& rows, const BertShardWriteOptions& opts) {
  const int64_t n = rows.rows(), l = rows.seq_len, p = rows.max_predictions;
  COHORT_CHECK(l >= 1 && p >= 1, DataError, path, ": cannot write a shard with seq_len ", l,
               " and max_predictions ", p, "; both must be >= 1");
  COHORT_CHECK(opts.chunk_rows >= 1, DataError, path, ": chunk_rows must be >= 1, got ", opts.chunk_rows);
  COHORT_CHECK(opts.gzip_level >= 0 && opts.gzip_level <= 9, DataError, path, ": gzip_level must be in [0, 9], got ",
               opts.gzip_level);
  auto check_size = [&](const char* field, size_t got, int64_t want, const char* shape) {
    COHORT_CHECK(static_cast<int64_t>(got) == want, DataError, path, ": ", field, " has ", got, " values; expected ",
                 want, " = ", shape, " for N=", n, " rows (next_sentence_labels), L=", l, ", P=", p);
  };
  check_size("input_ids", rows.input_ids.size(), n * l, "N*L");
  check_size("input_mask", rows.input_mask.size(), n * l, "N*L");
  check_size("segment_ids", rows.segment_ids.size(), n * l, "N*L");
  check_size("masked_lm_positions", rows.masked_lm_positions.size(), n * p, "N*P");
  check_size("masked_lm_ids", rows.masked_lm_ids.size(), n * p, "N*P");

  const std::string tmp = path + ".tmp";
  try {
    Hdf5Lock lock;
    // The HDF5 1.10 file format: its fixed-array chunk index finds a chunk in
    // O(1) and keeps an open file's metadata small, which random row access
    // needs (v1 B-trees cost 3x the memory and a tree walk per read).
    // Readers need HDF5 >= 1.10 (2016), as every current h5py has.
    H5Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    COHORT_CHECK(fapl.ok() && H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V110, H5F_LIBVER_V110) >= 0, DataError,
                 tmp, ": cannot set up the HDF5 file format (", hdf5_detail(), ")");
    H5Id f(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
    COHORT_CHECK(f.ok(), DataError, tmp, ": cannot create (", hdf5_detail(), ")");
    const hsize_t N = static_cast<hsize_t>(n), L = static_cast<hsize_t>(l), P = static_cast<hsize_t>(p);
    write_dataset(f.get(), path, kInputIds, {N, L}, rows.input_ids.data(), opts);
    write_dataset(f.get(), path, kInputMask, {N, L}, rows.input_mask.data(), opts);
    write_dataset(f.get(), path, kSegmentIds, {N, L}, rows.segment_ids.data(), opts);
    write_dataset(f.get(), path, kMaskedPositions, {N, P}, rows.masked_lm_positions.data(), opts);
    write_dataset(f.get(), path, kMaskedIds, {N, P}, rows.masked_lm_ids.data(), opts);
    write_dataset(f.get(), path, kNextSentence, {N}, rows.next_sentence_labels.data(), opts);
    // Closing flushes: its failure (a full disk) is the write's failure.
    COHORT_CHECK(H5Fclose(f.release()) >= 0, DataError, tmp, ": cannot finish writing (", hdf5_detail(), ")");
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  commit_file(tmp, path);
}

}  // namespace cohort
