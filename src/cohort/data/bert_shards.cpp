#include "cohort/data/bert_shards.hpp"

#include <hdf5.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <list>
#include <mutex>
#include <numeric>
#include <unordered_map>
#include <utility>

#include "cohort/core/error.hpp"
#include "cohort/data/hdf5_shard.hpp"
#include "cohort/data/manifest.hpp"

namespace cohort {

using namespace hdf5;

namespace {

// A least-recently-used map with a fixed capacity. Not thread-safe.
template <class K, class V>
class Lru {
 public:
  explicit Lru(size_t capacity) : capacity_(capacity) {}
  V* find(const K& key) {
    auto it = map_.find(key);
    if (it == map_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    return &it->second->second;
  }
  V& put(const K& key, V value) {
    if (V* v = find(key)) return *v = std::move(value);
    order_.emplace_front(key, std::move(value));
    map_[key] = order_.begin();
    while (order_.size() > capacity_) {
      map_.erase(order_.back().first);
      order_.pop_back();
    }
    return order_.front().second;
  }
  void clear() {
    map_.clear();
    order_.clear();
  }
  size_t size() const { return order_.size(); }

 private:
  size_t capacity_;
  std::list<std::pair<K, V>> order_;
  std::unordered_map<K, typename std::list<std::pair<K, V>>::iterator> map_;
};

// One shard file: where it is, which global rows it holds, how it is read.
struct ShardFile {
  std::string path;
  int64_t rows = 0;
  int64_t first = 0;       // global index of its row 0
  int64_t block_rows = 0;  // rows per cache block
  std::array<int64_t, kNumKeys> chunk_rows{};  // per dataset; 0: not chunked
};

// An open shard: the file and its six datasets.
struct OpenShard {
  H5Id file;
  std::array<H5Id, kNumKeys> sets;
};

// `rows` consecutive rows of one file, all six datasets, flat row-major.
struct Block {
  int64_t rows = 0;
  std::vector<int32_t> input_ids, masked_lm_positions, masked_lm_ids;
  std::vector<int8_t> input_mask, segment_ids, next_sentence_labels;
};

// The end of row `r`'s real content: one past its last real token or masked
// position, whichever is later. For NVIDIA's data, the sum of input_mask.
int64_t row_end(const Block& b, int64_t r, int64_t l, int64_t p) {
  int64_t end = 0;
  const int8_t* mask = b.input_mask.data() + r * l;
  for (int64_t j = l; j > 0; --j) {
    if (mask[j - 1] != 0) {
      end = j;
      break;
    }
  }
  const int32_t* pos = b.masked_lm_positions.data() + r * p;
  for (int64_t j = 0; j < p && pos[j] != 0; ++j) end = std::max<int64_t>(end, pos[j] + 1);
  return end;
}

int64_t mask_sum(const int8_t* mask, int64_t l) {
  int64_t s = 0;
  for (int64_t j = 0; j < l; ++j) s += mask[j] != 0;
  return s;
}

}  // namespace

struct BertShards::Impl {
  std::string dir, split;
  BertShardsOptions opts;
  BertShardInfo info;
  std::vector<ShardFile> files;
  std::vector<int64_t> starts;  // files[i].first, then the total

  // Under the HDF5 lock.
  Lru<int64_t, std::unique_ptr<OpenShard>> open{1};

  // Under `mu`. Blocks are keyed by the global index of their first row.
  mutable std::mutex mu;
  Lru<int64_t, std::shared_ptr<const Block>> blocks{1};
  // Real length of every row once length() is first asked (0xFFFF: unknown).
  // 2 bytes a row, allocated only when lengths are used (length bucketing).
  std::vector<uint16_t> lengths;
  static constexpr uint16_t kUnknown = 0xFFFF;

  // Where global row `index` lives.
  struct Where {
    int64_t file = 0;
    int64_t block = 0;     // block of that file
    int64_t key = 0;       // global index of the block's first row
    int64_t in_block = 0;  // row within the block
  };
  Where locate(int64_t index) const {
    COHORT_CHECK(index >= 0 && index < info.rows, Error, "BertShards: index ", index, " is out of range [0, ",
                 info.rows, ")");
    Where w;
    w.file = std::upper_bound(starts.begin(), starts.end(), index) - starts.begin() - 1;
    const ShardFile& f = files[static_cast<size_t>(w.file)];
    const int64_t r = index - f.first;
    w.block = r / f.block_rows;
    w.key = f.first + w.block * f.block_rows;
    w.in_block = r - w.block * f.block_rows;
    return w;
  }

  // The open shard `f`. Under the HDF5 lock.
  OpenShard& open_shard(int64_t f) {
    if (auto* s = open.find(f)) return **s;
    const std::string& path = files[static_cast<size_t>(f)].path;
    auto s = std::make_unique<OpenShard>();
    s->file = open_for_read(path);
    // A dataset whose chunks are exactly this file's blocks gets no HDF5
    // chunk cache: each block reads whole chunks once, straight into the
    // block, and the cache would only hold a second copy (up to 1 MiB per
    // dataset per open file). Other layouts keep HDF5's default cache, since
    // neighbouring blocks share their chunks.
    H5Id uncached(H5Pcreate(H5P_DATASET_ACCESS), H5Pclose);
    COHORT_CHECK(uncached.ok() && H5Pset_chunk_cache(uncached.get(), 0, 0, 1.0) >= 0, DataError, path,
                 ": cannot set up reading (", hdf5_detail(), ")");
    const ShardFile& file = files[static_cast<size_t>(f)];
    for (int k = 0; k < kNumKeys; ++k) {
      const bool aligned = file.chunk_rows[static_cast<size_t>(k)] == file.block_rows;
      s->sets[k] = H5Id(H5Dopen2(s->file.get(), kKeyNames[k], aligned ? uncached.get() : H5P_DEFAULT), H5Dclose);
      COHORT_CHECK(s->sets[k].ok(), DataError, path, ": cannot open dataset '", kKeyNames[k], "' (", hdf5_detail(),
                   "); did the file change since it was opened?");
    }
    return *open.put(f, std::move(s));
  }

  // Reads rows [r0, r0+n) of dataset `k` of shard `f` into `out`, converted to
  // int32 or int8. Under the HDF5 lock.
  template <class T>
  void read_rows(int64_t f, int k, int64_t r0, int64_t n, int64_t cols, std::vector<T>& out) {
    OpenShard& s = open_shard(f);
    const bool matrix = kRanks[k] == 2;
    out.resize(static_cast<size_t>(n * cols));
    hsize_t start[2] = {static_cast<hsize_t>(r0), 0};
    hsize_t count[2] = {static_cast<hsize_t>(n), static_cast<hsize_t>(cols)};
    H5Id fspace(H5Dget_space(s.sets[k].get()), H5Sclose);
    H5Id mspace(H5Screate_simple(matrix ? 2 : 1, count, nullptr), H5Sclose);
    bool ok = fspace.ok() && mspace.ok() &&
              H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr) >= 0 &&
              H5Dread(s.sets[k].get(), sizeof(T) == 4 ? H5T_NATIVE_INT32 : H5T_NATIVE_INT8, mspace.get(),
                      fspace.get(), H5P_DEFAULT, out.data()) >= 0;
    COHORT_CHECK(ok, DataError, files[static_cast<size_t>(f)].path, ": cannot read rows ", r0, "..", r0 + n - 1,
                 " of dataset '", kKeyNames[k], "' (", hdf5_detail(), "); is the file corrupt?");
  }

  // Block `b` of shard `f`, checked. Takes the HDF5 lock.
  std::shared_ptr<const Block> load_block(int64_t f, int64_t b) {
    const ShardFile& file = files[static_cast<size_t>(f)];
    const int64_t l = info.seq_len, p = info.max_predictions;
    const int64_t r0 = b * file.block_rows, n = std::min(file.block_rows, file.rows - r0);
    auto blk = std::make_shared<Block>();
    blk->rows = n;
    {
      Hdf5Lock lock;
      read_rows(f, kInputIds, r0, n, l, blk->input_ids);
      read_rows(f, kInputMask, r0, n, l, blk->input_mask);
      read_rows(f, kSegmentIds, r0, n, l, blk->segment_ids);
      read_rows(f, kMaskedPositions, r0, n, p, blk->masked_lm_positions);
      read_rows(f, kMaskedIds, r0, n, p, blk->masked_lm_ids);
      read_rows(f, kNextSentence, r0, n, 1, blk->next_sentence_labels);
    }
    // Bad values fail here, naming the file, rather than as an index error
    // deep inside the model.
    const int64_t vocab = info.vocab_size > 0 ? info.vocab_size : int64_t(1) << 31;
    auto bad = [&](int k, int64_t i, int64_t cols, int64_t value, const std::string& want) {
      return DataError(detail::cat(file.path, ": dataset '", kKeyNames[k], "' row ", r0 + i / cols, " column ",
                                   i % cols, " holds ", value, "; expected ", want));
    };
    for (int64_t i = 0; i < n * l; ++i) {
      int32_t v = blk->input_ids[static_cast<size_t>(i)];
      if (v < 0 || v >= vocab) throw bad(kInputIds, i, l, v, detail::cat("a token id in [0, ", vocab, ")"));
    }
    for (int64_t i = 0; i < n * l; ++i) {
      int8_t v = blk->segment_ids[static_cast<size_t>(i)];
      if (v != 0 && v != 1) throw bad(kSegmentIds, i, l, v, "0 (sentence A) or 1 (sentence B)");
    }
    for (int64_t r = 0; r < n; ++r) {
      int8_t v = blk->next_sentence_labels[static_cast<size_t>(r)];
      if (v != 0 && v != 1) throw bad(kNextSentence, r, 1, v, "0 or 1");
    }
    for (int64_t r = 0; r < n; ++r) {
      bool padding = false;  // ids past the first 0 position are ignored
      for (int64_t i = r * p; i < (r + 1) * p; ++i) {
        int32_t pos = blk->masked_lm_positions[static_cast<size_t>(i)];
        if (pos < 0 || pos >= l) throw bad(kMaskedPositions, i, p, pos, detail::cat("a position in [0, L=", l, ")"));
        padding = padding || pos == 0;
        int32_t id = blk->masked_lm_ids[static_cast<size_t>(i)];
        if (!padding && (id < 0 || id >= vocab))
          throw bad(kMaskedIds, i, p, id, detail::cat("a token id in [0, ", vocab, ")"));
      }
    }
    return blk;
  }

  std::shared_ptr<const Block> block(const Where& w) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (auto* hit = blocks.find(w.key)) return *hit;
    }
    // Read outside `mu`: other threads keep hitting the cache meanwhile. Two
    // threads may read the same block at once; the second put wins, harmlessly.
    auto blk = load_block(w.file, w.block);
    std::lock_guard<std::mutex> lock(mu);
    note_lengths(w.key, *blk);
    return blocks.put(w.key, std::move(blk));
  }

  // Under `mu`.
  void note_lengths(int64_t first, const Block& blk) {
    if (lengths.empty()) return;
    for (int64_t r = 0; r < blk.rows; ++r) {
      lengths[static_cast<size_t>(first + r)] =
          static_cast<uint16_t>(mask_sum(blk.input_mask.data() + r * info.seq_len, info.seq_len));
    }
  }

  Example gather(const std::vector<int64_t>& indices, bool trim) {
    const int64_t l = info.seq_len, p = info.max_predictions;
    const int64_t n = static_cast<int64_t>(indices.size());
    COHORT_CHECK(n > 0, Error, "BertShards: get_batch of no indices");
    // Each row's block, read once per batch; the batch holds its blocks even
    // if the cache evicts them meanwhile.
    std::vector<std::pair<const Block*, int64_t>> where(static_cast<size_t>(n));
    std::unordered_map<int64_t, std::shared_ptr<const Block>> held;
    for (int64_t i = 0; i < n; ++i) {
      const Where w = locate(indices[static_cast<size_t>(i)]);
      auto& blk = held[w.key];
      if (!blk) blk = block(w);
      where[static_cast<size_t>(i)] = {blk.get(), w.in_block};
    }
    int64_t width = l;
    if (trim) {
      width = 1;
      for (auto [blk, r] : where) width = std::max(width, row_end(*blk, r, l, p));
    }
    auto opt = torch::TensorOptions().dtype(torch::kInt64);
    torch::Tensor ids = torch::empty({n, width}, opt), mask = torch::empty({n, width}, opt),
                  seg = torch::empty({n, width}, opt), pos = torch::empty({n, p}, opt),
                  mlm = torch::empty({n, p}, opt), nsl = torch::empty({n}, opt);
    int64_t *ids_p = ids.data_ptr<int64_t>(), *mask_p = mask.data_ptr<int64_t>(), *seg_p = seg.data_ptr<int64_t>(),
            *pos_p = pos.data_ptr<int64_t>(), *mlm_p = mlm.data_ptr<int64_t>(), *nsl_p = nsl.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      const auto [blk, r] = where[static_cast<size_t>(i)];
      std::copy_n(blk->input_ids.data() + r * l, width, ids_p + i * width);
      std::copy_n(blk->input_mask.data() + r * l, width, mask_p + i * width);
      std::copy_n(blk->segment_ids.data() + r * l, width, seg_p + i * width);
      const int32_t* bp = blk->masked_lm_positions.data() + r * p;
      const int32_t* bm = blk->masked_lm_ids.data() + r * p;
      // NVIDIA's convention: positions are 0-padded ([CLS] at 0 is never
      // masked), so the first 0 ends the real predictions.
      bool padding = false;
      for (int64_t j = 0; j < p; ++j) {
        padding = padding || bp[j] == 0;
        pos_p[i * p + j] = padding ? 0 : bp[j];  // past the trimmed width otherwise
        mlm_p[i * p + j] = padding ? -1 : bm[j];
      }
      nsl_p[i] = blk->next_sentence_labels[static_cast<size_t>(r)];
    }
    return {{"input_ids", ids},          {"input_mask", mask},    {"segment_ids", seg},
            {"masked_lm_positions", pos}, {"masked_lm_ids", mlm}, {"next_sentence_labels", nsl}};
  }

  int64_t length(int64_t index) {
    const Where w = locate(index);
    const ShardFile& file = files[static_cast<size_t>(w.file)];
    const bool cacheable = info.seq_len < kUnknown;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (cacheable && lengths.empty()) lengths.assign(static_cast<size_t>(info.rows), kUnknown);
      if (cacheable && lengths[static_cast<size_t>(index)] != kUnknown) return lengths[static_cast<size_t>(index)];
      if (auto* hit = blocks.find(w.key)) {
        note_lengths(w.key, **hit);
        return mask_sum((*hit)->input_mask.data() + w.in_block * info.seq_len, info.seq_len);
      }
    }
    // Only input_mask, and not through the block cache: a pass over every
    // row's length must not evict the blocks training is using.
    Block blk;
    const int64_t r0 = w.block * file.block_rows;
    blk.rows = std::min(file.block_rows, file.rows - r0);
    {
      Hdf5Lock lock;
      read_rows(w.file, kInputMask, r0, blk.rows, info.seq_len, blk.input_mask);
    }
    std::lock_guard<std::mutex> lock(mu);
    note_lengths(w.key, blk);
    return mask_sum(blk.input_mask.data() + w.in_block * info.seq_len, info.seq_len);
  }
};

BertShards::BertShards(const std::string& dir, const std::string& split, BertShardsOptions opts)
    : impl_(std::make_unique<Impl>()) {
  COHORT_CHECK(opts.block_rows >= 0, ConfigError, "BertShardsOptions.block_rows must be >= 0, got ", opts.block_rows);
  COHORT_CHECK(opts.cache_blocks >= 1, ConfigError, "BertShardsOptions.cache_blocks must be >= 1, got ",
               opts.cache_blocks);
  COHORT_CHECK(opts.open_files >= 1, ConfigError, "BertShardsOptions.open_files must be >= 1, got ",
               opts.open_files);
  Impl& m = *impl_;
  m.dir = dir;
  m.split = split;
  m.opts = opts;
  m.open = Lru<int64_t, std::unique_ptr<OpenShard>>(static_cast<size_t>(opts.open_files));
  m.blocks = Lru<int64_t, std::shared_ptr<const Block>>(static_cast<size_t>(opts.cache_blocks));

  std::string first_path;
  const std::vector<std::string> files = shard_files(dir, split);
  inspect_guarded(files);
  for (const std::string& path : files) {
    ShardShape s;
    {
      Hdf5Lock lock;
      s = inspect(path);
    }
    if (m.files.empty()) {
      m.info.seq_len = s.l;
      m.info.max_predictions = s.p;
      first_path = path;
    }
    COHORT_CHECK(s.l == m.info.seq_len, DataError, path, ": dataset 'input_ids' has L=", s.l, " columns; expected L=",
                 m.info.seq_len, " like the first shard ", first_path);
    COHORT_CHECK(s.p == m.info.max_predictions, DataError, path, ": dataset 'masked_lm_positions' has P=", s.p,
                 " columns; expected P=", m.info.max_predictions, " like the first shard ", first_path);
    // A block per chunk: reading one row decompresses its whole chunk anyway,
    // and a block that cut a chunk would decompress it twice.
    const int64_t chunk = s.chunk_rows[kInputIds];
    const int64_t block_rows = opts.block_rows > 0 ? opts.block_rows : chunk > 0 ? std::min<int64_t>(chunk, 4096) : 256;
    m.files.push_back({path, s.n, m.info.rows, block_rows, s.chunk_rows});
    m.starts.push_back(m.info.rows);
    m.info.rows += s.n;
  }
  m.starts.push_back(m.info.rows);
  m.info.files = static_cast<int64_t>(m.files.size());
  if (auto manifest = read_manifest(dir)) {
    m.info.vocab_size = manifest->vocab_size;
    m.info.masked = manifest->masked;
    m.info.next_sentence = manifest->next_sentence;
  }
}

BertShards::~BertShards() {
  // The open files are HDF5 ids: close them under the HDF5 lock.
  Hdf5Lock lock;
  impl_->open.clear();
}

int64_t BertShards::size() const { return impl_->info.rows; }

Example BertShards::get(int64_t index) const {
  Example ex = impl_->gather({index}, /*trim=*/false);
  for (auto& [name, t] : ex) t = t.squeeze(0);
  return ex;
}

void restore_masked_tokens(Example& batch) {
  torch::Tensor ids = batch.at("input_ids").to(torch::kInt64).clone(at::MemoryFormat::Contiguous);
  const torch::Tensor pos = batch.at("masked_lm_positions").to(torch::kInt64).contiguous();
  const torch::Tensor mlm = batch.at("masked_lm_ids").to(torch::kInt64).contiguous();
  const int64_t n = ids.size(0), width = ids.size(1), p = pos.size(1);
  int64_t* tok = ids.data_ptr<int64_t>();
  const int64_t *pp = pos.data_ptr<int64_t>(), *mp = mlm.data_ptr<int64_t>();
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t j = 0; j < p; ++j) {
      const int64_t at = pp[b * p + j], id = mp[b * p + j];
      if (id >= 0 && at >= 0 && at < width) tok[b * width + at] = id;
    }
  }
  batch["input_ids"] = ids;
  batch["masked_lm_positions"] = torch::zeros({n, 1}, torch::kInt64);
  batch["masked_lm_ids"] = torch::full({n, 1}, -1, torch::kInt64);
}

Example BertShards::get_batch(const std::vector<int64_t>& indices) const {
  Example batch = impl_->gather(indices, true);
  if (impl_->opts.masking && !impl_->info.masked) impl_->opts.masking->apply_for_evaluation(batch, indices);
  return impl_->opts.pack ? pack_bert_rows(batch, impl_->info.seq_len, indices) : batch;
}

Example BertShards::draw_batch(const std::vector<int64_t>& indices, int64_t epoch) const {
  if (!impl_->opts.masking) return get_batch(indices);
  Example batch = impl_->gather(indices, true);
  restore_masked_tokens(batch);
  impl_->opts.masking->apply(batch, indices, epoch);
  return impl_->opts.pack ? pack_bert_rows(batch, impl_->info.seq_len, indices) : batch;
}

std::string BertShards::describe() const {
  const BertShardInfo& i = impl_->info;
  return detail::cat("BERT shards: ", i.files, " files, ", i.rows, " rows, L=", i.seq_len, ", P=", i.max_predictions,
                     i.vocab_size > 0 ? detail::cat(", vocab ", i.vocab_size) : std::string(), " under ", impl_->dir,
                     " (split ", impl_->split, ")");
}

const BertShardInfo& BertShards::info() const { return impl_->info; }

int64_t BertShards::length(int64_t index) const { return impl_->length(index); }

}  // namespace cohort
