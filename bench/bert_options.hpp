// The BERT shape flags the benchmark tools share (--vocab, --hidden,
// --layers, --heads, --intermediate), bound to a BertConfig whose defaults
// are bert-small's: 4 layers of 256, 4 heads, BERT's 30522-token vocabulary.
#pragma once

#include <CLI/CLI.hpp>

#include "cohort/model/bert.hpp"

namespace cohort::bench {

// The config the flags fill; call resolve() after parsing.
struct BertOptions {
  BertConfig config;

  explicit BertOptions(CLI::App& app) {
    config.vocab_size = 30522;
    config.hidden = 256;
    config.layers = 4;
    config.heads = 4;
    config.intermediate = 0;
    app.add_option("--vocab", config.vocab_size)->capture_default_str();
    app.add_option("--hidden", config.hidden)->capture_default_str();
    app.add_option("--layers", config.layers)->capture_default_str();
    app.add_option("--heads", config.heads)->capture_default_str();
    app.add_option("--intermediate", config.intermediate, "0 = 4 * hidden")->capture_default_str();
  }

  const BertConfig& resolve() {
    if (config.intermediate == 0) config.intermediate = 4 * config.hidden;
    return config;
  }
};

}  // namespace cohort::bench
