// The fuzz targets: every reader of untrusted bytes (fuzz.hpp).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <numeric>

#include "cohort/ckpt/checkpoint.hpp"
#include "cohort/ckpt/safetensors.hpp"
#include "cohort/config/config.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/sha256.hpp"
#include "cohort/data/bert_shards.hpp"
#include "cohort/data/idx.hpp"
#include "cohort/text/wordpiece.hpp"
#include "fuzz.hpp"

namespace cohort::fuzz {

namespace {

// Runs `fn`; the refusal the readers promise is the only accepted failure.
template <class Fn>
int refused_or_read(Fn fn) {
  try {
    fn();
  } catch (const cohort::Error&) {
  }
  return 0;
}

// A small vocabulary with whole words, pieces and the specials.
text::Vocab test_vocab() {
  std::vector<std::string> tokens = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
  for (const char* t : {"the", "un", "##want", "##ed", "runn", "##ing", ",", ".", "a", "##b", "é", "日", "本"})
    tokens.push_back(t);
  return text::Vocab(tokens);
}

}  // namespace

int safetensors(const uint8_t* data, size_t size) {
  FuzzFile f("safetensors", "model.safetensors", data, size);
  return refused_or_read([&] {
    auto file = load_safetensors(f.path());
    for (auto& [name, t] : file.tensors) (void)t.sum();  // every byte it claims is readable
  });
}

int idx(const uint8_t* data, size_t size) {
  bool gz = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
  FuzzFile f("idx", gz ? "train-images-idx3-ubyte.gz" : "train-images-idx3-ubyte", data, size);
  return refused_or_read([&] {
    IdxArray a = read_idx(f.path());
    int64_t n = std::accumulate(a.dims.begin(), a.dims.end(), int64_t{1}, std::multiplies<int64_t>());
    if (a.data.numel() != n) std::abort();  // the shape must describe the data read
    (void)a.data.sum();
  });
}

int toml(const uint8_t* data, size_t size) {
  FuzzFile f("toml", "config.toml", data, size);
  std::string text(reinterpret_cast<const char*>(data), size);
  return refused_or_read([&] {
    CLI::App app;
    Config cfg;
    ConfigBinding binding(app, cfg);
    app.parse(std::vector<std::string>{});
    binding.apply_file(f.path());
    validate(cfg);
    // What was accepted writes back and reads again as the same values.
    std::string out = binding.to_toml();
    if (read_config_values(out).size() != binding.keys().size()) std::abort();
  }) + refused_or_read([&] { (void)read_config_values(text); });
}

int vocab(const uint8_t* data, size_t size) {
  FuzzFile f("vocab", "vocab.txt", data, size);
  return refused_or_read([&] {
    text::Vocab v = text::Vocab::load(f.path());
    text::WordPiece wp(v, {});
    for (int32_t id : wp.encode("the unwanted running, a b.")) {
      if (id < 0 || id >= v.size()) std::abort();
    }
  });
}

int tokenizer(const uint8_t* data, size_t size) {
  static const text::WordPiece cased(test_vocab(), {/*lowercase=*/false, 100});
  static const text::WordPiece uncased(test_vocab(), {/*lowercase=*/true, 100});
  std::string_view input(reinterpret_cast<const char*>(data), size);
  return refused_or_read([&] {
    for (const auto* wp : {&cased, &uncased}) {
      for (int32_t id : wp->encode(input)) {
        if (id < 0 || id >= wp->vocab().size()) std::abort();
      }
    }
  });
}

int state_json(const uint8_t* data, size_t size) {
  // The input as it is; or, after a leading 'S', re-signed when it is a
  // JSON object, so that the fields behind the checksum are reached too.
  std::string text(reinterpret_cast<const char*>(data), size);
  if (size > 0 && data[0] == 'S') {
    try {
      auto j = nlohmann::json::parse(text.substr(1));
      if (j.is_object()) {
        j.erase("state_sha256");
        j["state_sha256"] = sha256_hex(j.dump());
        text = j.dump(2);
      }
    } catch (const std::exception&) {
    }
  }
  FuzzFile f("state", "step-1/state.json", reinterpret_cast<const uint8_t*>(text.data()), text.size());
  return refused_or_read([&] { (void)Checkpoints::verify(f.dir() + "/step-1"); });
}

int hdf5_shard(const uint8_t* data, size_t size) {
  FuzzFile f("hdf5", "train/part-00000.hdf5", data, size);
  return refused_or_read([&] {
    BertShards shards(f.dir(), "train");
    std::vector<int64_t> rows;
    for (int64_t i = 0; i < std::min<int64_t>(shards.size(), 64); ++i) rows.push_back(i);
    if (!rows.empty()) (void)shards.get_batch(rows);
  });
}

}  // namespace cohort::fuzz
