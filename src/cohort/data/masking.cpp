#include "cohort/data/masking.hpp"

#include <algorithm>

#include "cohort/core/error.hpp"
#include "cohort/core/random.hpp"
#include "cohort/text/wordpiece.hpp"

namespace cohort {

MaskingVocab MaskingVocab::from(const text::Vocab& vocab) {
  MaskingVocab mv;
  mv.cls = vocab.require("[CLS]");
  mv.sep = vocab.require("[SEP]");
  mv.mask = vocab.require("[MASK]");
  mv.pad = vocab.find("[PAD]");
  mv.unk = vocab.find("[UNK]");
  mv.continuation.resize(static_cast<size_t>(vocab.size()), 0);
  for (int32_t id = 0; id < vocab.size(); ++id) {
    const std::string& t = vocab.token(id);
    mv.continuation[static_cast<size_t>(id)] = t.size() > 2 && t[0] == '#' && t[1] == '#';
    bool bracketed = t.size() >= 3 && t.front() == '[' && t.back() == ']';
    if (!bracketed) mv.random_pool.push_back(id);
  }
  return mv;
}

uint64_t mask_key(uint64_t seed, int64_t epoch, int64_t sample_id) {
  constexpr uint64_t kMaskDomain = 0x6d61736b2d6c6dull;  // "mask-lm": apart from dropout's keys
  return splitmix64(splitmix64(splitmix64(seed ^ kMaskDomain) + static_cast<uint64_t>(epoch)) +
                    static_cast<uint64_t>(sample_id));
}

namespace {

// Draw `stream` (0: pick, 1: replacement kind, 2: random token) at `position`
// of the row keyed by `key`.
uint64_t draw(uint64_t key, int64_t position, uint64_t stream) {
  return splitmix64(key ^ splitmix64(static_cast<uint64_t>(position) * 4 + stream));
}

double unit(uint64_t h) { return static_cast<double>(h >> 11) * 0x1.0p-53; }

// Uniform in [0, n) from 64 random bits (Lemire's multiply; bias < n / 2^64).
uint64_t below(uint64_t h, uint64_t n) { return static_cast<uint64_t>((static_cast<unsigned __int128>(h) * n) >> 64); }

}  // namespace

DynamicMasking::DynamicMasking(MaskingVocab vocab, MaskOptions opts) : vocab_(std::move(vocab)), opts_(opts) {
  COHORT_CHECK(opts_.prob >= 0 && opts_.prob <= 1, ConfigError, "task.mask-prob must be in [0, 1], got ", opts_.prob);
  COHORT_CHECK(opts_.replace_mask >= 0 && opts_.replace_random >= 0 && opts_.replace_mask + opts_.replace_random <= 1 + 1e-9,
               ConfigError, "task.mask-replace: [MASK] ", opts_.replace_mask, " and random ", opts_.replace_random,
               " must be >= 0 and sum to at most 1");
  COHORT_CHECK(opts_.max_predictions >= 0, ConfigError, "task.max-predictions must be >= 0 (0: no cap), got ",
               opts_.max_predictions);
  COHORT_CHECK(vocab_.mask >= 0, ConfigError, "dynamic masking needs the vocabulary's [MASK] token");
}

void DynamicMasking::mask_row(int64_t* tokens, int64_t length, uint64_t key, std::vector<int64_t>& positions,
                              std::vector<int64_t>& labels) const {
  positions.clear();
  labels.clear();
  // Candidates, grouped into words: group g is cand[starts[g] .. starts[g+1]).
  thread_local std::vector<int64_t> cand;
  thread_local std::vector<size_t> starts, picked;
  thread_local std::vector<double> u;
  cand.clear();
  starts.clear();
  picked.clear();
  u.clear();
  for (int64_t i = 0; i < length; ++i) {
    if (vocab_.is_special(tokens[i])) continue;
    const bool joins = opts_.whole_word && !cand.empty() && cand.back() == i - 1 && vocab_.is_continuation(tokens[i]);
    if (!joins) starts.push_back(cand.size());
    cand.push_back(i);
  }
  const size_t groups = starts.size();
  auto group_end = [&](size_t g) { return g + 1 < groups ? starts[g + 1] : cand.size(); };
  size_t picked_tokens = 0;
  for (size_t g = 0; g < groups; ++g) {
    u.push_back(unit(draw(key, cand[starts[g]], 0)));
    if (u.back() < opts_.prob) {
      picked.push_back(g);
      picked_tokens += group_end(g) - starts[g];
    }
  }
  if (opts_.max_predictions > 0 && picked_tokens > static_cast<size_t>(opts_.max_predictions)) {
    // Over the cap: keep the words with the smallest draws that fit (a
    // uniformly random subset), skipping a word that would overshoot.
    std::stable_sort(picked.begin(), picked.end(), [&](size_t a, size_t b) { return u[a] < u[b]; });
    size_t kept = 0, used = 0;
    for (size_t g : picked) {
      const size_t n = group_end(g) - starts[g];
      if (used + n > static_cast<size_t>(opts_.max_predictions)) continue;
      used += n;
      picked[kept++] = g;
    }
    picked.resize(kept);
    std::sort(picked.begin(), picked.end());
  }
  const double keep_from = opts_.replace_mask + opts_.replace_random;
  for (size_t g : picked) {
    for (size_t j = starts[g]; j < group_end(g); ++j) {
      const int64_t at = cand[j];
      positions.push_back(at);
      labels.push_back(tokens[at]);
      const double v = unit(draw(key, at, 1));
      if (v < opts_.replace_mask) {
        tokens[at] = vocab_.mask;
      } else if (v < keep_from && !vocab_.random_pool.empty()) {
        tokens[at] = vocab_.random_pool[below(draw(key, at, 2), vocab_.random_pool.size())];
      }
    }
  }
}

void DynamicMasking::apply(Example& batch, const std::vector<int64_t>& sample_ids, int64_t epoch) const {
  apply_keyed(batch, sample_ids, opts_.seed, epoch);
}

void DynamicMasking::apply_for_evaluation(Example& batch, const std::vector<int64_t>& sample_ids) const {
  apply_keyed(batch, sample_ids, /*seed=*/0, /*epoch=*/-1);
}

void DynamicMasking::apply_keyed(Example& batch, const std::vector<int64_t>& sample_ids, uint64_t seed,
                                 int64_t epoch) const {
  // A copy: the caller's tensor may be shared (a copied Example shares them).
  torch::Tensor ids = batch.at("input_ids").to(torch::kInt64).clone(at::MemoryFormat::Contiguous);
  const torch::Tensor mask = batch.at("input_mask").to(torch::kInt64).contiguous();
  const int64_t n = ids.size(0), width = ids.size(1);
  COHORT_CHECK(static_cast<int64_t>(sample_ids.size()) == n, Error, "dynamic masking: ", sample_ids.size(),
               " sample ids for a batch of ", n);
  std::vector<std::vector<int64_t>> pos(static_cast<size_t>(n)), lab(static_cast<size_t>(n));
  int64_t* tok = ids.data_ptr<int64_t>();
  const int64_t* real = mask.data_ptr<int64_t>();
  size_t most = 1;
  for (int64_t b = 0; b < n; ++b) {
    int64_t length = width;  // real tokens are a prefix (the NVIDIA layout)
    while (length > 0 && real[b * width + length - 1] == 0) --length;
    mask_row(tok + b * width, length, mask_key(seed, epoch, sample_ids[static_cast<size_t>(b)]),
             pos[static_cast<size_t>(b)], lab[static_cast<size_t>(b)]);
    most = std::max(most, pos[static_cast<size_t>(b)].size());
  }
  const auto p = static_cast<int64_t>(most);
  auto opt = torch::TensorOptions().dtype(torch::kInt64);
  torch::Tensor positions = torch::zeros({n, p}, opt), labels = torch::full({n, p}, -1, opt);
  int64_t *pp = positions.data_ptr<int64_t>(), *lp = labels.data_ptr<int64_t>();
  for (int64_t b = 0; b < n; ++b) {
    const auto& row = pos[static_cast<size_t>(b)];
    std::copy(row.begin(), row.end(), pp + b * p);
    std::copy(lab[static_cast<size_t>(b)].begin(), lab[static_cast<size_t>(b)].end(), lp + b * p);
  }
  batch["input_ids"] = ids;
  batch["masked_lm_positions"] = positions;
  batch["masked_lm_ids"] = labels;
}

}  // namespace cohort
