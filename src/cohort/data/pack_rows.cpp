#include "cohort/core/error.hpp"
#include "cohort/data/bert_shards.hpp"

namespace cohort {

Example pack_bert_rows(const Example& batch, int64_t row_len, const std::vector<int64_t>& sample_ids) {
  const auto& ids = batch.at("input_ids");
  const int64_t n = ids.size(0), width = ids.size(1), p = batch.at("masked_lm_positions").size(1);
  for (const auto& [key, t] : batch) {
    COHORT_CHECK(t.is_cpu(), Error, "data.pack: packs batches on the CPU, before they move; '", key, "' is on ",
                 t.device());
  }
  COHORT_CHECK(width <= row_len, DataError, "data.pack: rows of ", width, " tokens do not fit rows of ", row_len);
  COHORT_CHECK(sample_ids.empty() || static_cast<int64_t>(sample_ids.size()) == n, Error, "data.pack: ",
               sample_ids.size(), " sample ids for a batch of ", n);
  // Errors name the dataset's sample where the caller gave it.
  auto which = [&](int64_t i) {
    return sample_ids.empty() ? detail::cat("row ", i, " of the batch")
                              : detail::cat("sample ", sample_ids[static_cast<size_t>(i)]);
  };
  auto contiguous = [&](const char* key) { return batch.at(key).to(torch::kInt64).contiguous(); };
  auto in_ids = contiguous("input_ids"), in_seg = contiguous("segment_ids"), in_mask = contiguous("input_mask"),
       in_pos = contiguous("masked_lm_positions"), in_mlm = contiguous("masked_lm_ids");
  const int64_t* mask = in_mask.data_ptr<int64_t>();
  std::vector<int64_t> length(static_cast<size_t>(n)), order(static_cast<size_t>(n));
  const int64_t* pos_in = in_pos.data_ptr<int64_t>();
  const int64_t* mlm_in = in_mlm.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    int64_t len = 0, real = 0;
    while (len < width && mask[i * width + len] != 0) ++len;
    for (int64_t t = 0; t < width; ++t) real += mask[i * width + t] != 0;
    // Packing moves an instance's real tokens only: they must be a prefix,
    // and every prediction must point at one of them.
    COHORT_CHECK(real == len, DataError, "data.pack: ", which(i), " has padding inside it (input_mask ",
                 "is not 1s then 0s); such rows can only be read unpacked");
    for (int64_t j = 0; j < p; ++j) {
      const int64_t at = pos_in[i * p + j];
      COHORT_CHECK(mlm_in[i * p + j] < 0 || (at >= 0 && at < std::max<int64_t>(len, 1)), DataError, "data.pack: ",
                   which(i), " predicts position ", at, ", outside its ", len,
                   " real tokens; such rows can only be read unpacked");
    }
    length[static_cast<size_t>(i)] = std::max<int64_t>(len, 1);  // an empty row still has its [CLS] slot
  }
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return length[a] > length[b]; });
  // First fit, longest first: each instance's row and offset.
  std::vector<int64_t> used, row_of(static_cast<size_t>(n)), offset_of(static_cast<size_t>(n));
  for (int64_t i : order) {
    size_t r = 0;
    while (r < used.size() && used[r] + length[i] > row_len) ++r;
    if (r == used.size()) used.push_back(0);
    row_of[i] = static_cast<int64_t>(r);
    offset_of[i] = used[r];
    used[r] += length[i];
  }
  const int64_t rows = static_cast<int64_t>(used.size());
  const int64_t w = used.empty() ? 1 : *std::max_element(used.begin(), used.end());
  auto opt = torch::TensorOptions().dtype(torch::kInt64);
  auto out_ids = torch::zeros({rows, w}, opt), out_seg = torch::zeros({rows, w}, opt),
       out_mask = torch::zeros({rows, w}, opt), out_posn = torch::zeros({rows, w}, opt),
       out_seq = torch::full({rows, w}, -1, opt), cls = torch::empty({n}, opt), flat_pos = torch::zeros({n, p}, opt);
  int64_t *oi = out_ids.data_ptr<int64_t>(), *os = out_seg.data_ptr<int64_t>(), *om = out_mask.data_ptr<int64_t>(),
          *op = out_posn.data_ptr<int64_t>(), *oq = out_seq.data_ptr<int64_t>(), *oc = cls.data_ptr<int64_t>(),
          *of = flat_pos.data_ptr<int64_t>();
  const int64_t *ii = in_ids.data_ptr<int64_t>(), *is = in_seg.data_ptr<int64_t>(), *ip = pos_in, *im = mlm_in;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t base = row_of[i] * w + offset_of[i], len = length[i];
    for (int64_t t = 0; t < len && t < width; ++t) {
      oi[base + t] = ii[i * width + t];
      os[base + t] = is[i * width + t];
      om[base + t] = mask[i * width + t];
      op[base + t] = t;
      oq[base + t] = i;
    }
    oc[i] = base;
    for (int64_t j = 0; j < p; ++j) of[i * p + j] = im[i * p + j] >= 0 ? base + ip[i * p + j] : 0;
  }
  Example out = batch;
  out["input_ids"] = out_ids;
  out["segment_ids"] = out_seg;
  out["input_mask"] = out_mask;
  out["position_ids"] = out_posn;
  out["seq_ids"] = out_seq;
  out["cls_index"] = cls;
  out["masked_lm_positions"] = flat_pos;
  return out;
}

}  // namespace cohort
