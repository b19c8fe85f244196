#include "cohort/prep/prepare.hpp"
#include "commands/command.hpp"

namespace cohort::cli {

namespace {

class Prepare : public Command {
 public:
  CLI::App* add(CLI::App& app) override {
    CLI::App* sub = app.add_subcommand(
        "prepare", "BERT pretraining data: text files or the GCIDE dictionary -> WordPiece vocabulary -> "
                   "masked-LM/next-sentence instances -> HDF5 shards in OUT/{train,valid,test}/");
    sub->add_option("--input", o_.inputs,
                    "text file (one sentence per line, a blank line between documents; .gz read too) or the "
                    "GCIDE dictionary (.dict or .dict.dz, e.g. /usr/share/dictd/gcide.dict.dz); repeatable")
        ->required();
    sub->add_option("--out", o_.out, "output directory: vocab.txt, manifest.json, train/ valid/ test/")->required();
    sub->add_option("--tokenizer", o_.tokenizer,
                    "wordpiece: BERT's (vocab.txt); bpe: byte-level BPE, ModernBERT's and RoBERTa's (tokenizer.json, "
                    "which Hugging Face's tokenizers loads; vocab.txt lists its tokens)")
        ->check(CLI::IsMember({"wordpiece", "bpe"}))
        ->capture_default_str();
    sub->add_option("--vocab", o_.vocab, "use this vocab.txt (--tokenizer bpe: tokenizer.json) instead of building "
                    "one from the training split");
    sub->add_option("--vocab-size", o_.vocab_size, "tokens in the vocabulary built (without --vocab)")
        ->capture_default_str();
    sub->add_flag("--cased", cased_, "keep case and accents (default: lowercase and strip accents)");
    sub->add_option("--max-seq-length", o_.instances.max_seq_length, "tokens per instance, [CLS] and [SEP]s included")
        ->capture_default_str();
    sub->add_option("--max-predictions", o_.instances.max_predictions, "masked-LM targets per instance, at most")
        ->capture_default_str();
    sub->add_option("--masked-lm-prob", o_.instances.masked_lm_prob, "fraction of tokens to predict")
        ->capture_default_str();
    sub->add_option("--short-seq-prob", o_.instances.short_seq_prob,
                    "chance that a document aims at a shorter random length")
        ->capture_default_str();
    dupe_ = sub->add_option("--dupe-factor", o_.instances.dupe_factor,
                            "passes over the documents, each masked differently (--masking none --nsp false: 1)")
                ->capture_default_str();
    sub->add_flag("--whole-word-mask", o_.instances.whole_word_mask, "mask every piece of a word or none");
    sub->add_option("--masking", masking_,
                    "static: masked-LM targets drawn here (NVIDIA's layout); none: unmasked rows, for "
                    "task.masking dynamic (smaller, no --dupe-factor needed)")
        ->check(CLI::IsMember({"static", "none"}))
        ->capture_default_str();
    sub->add_option("--nsp", o_.instances.next_sentence,
                    "true: sentence pairs for next sentence prediction; false: rows filled with whole sentences "
                    "across documents ([SEP] between them), for task.nsp false")
        ->capture_default_str();
    sub->add_option("--valid-fraction", o_.valid_fraction, "fraction of documents for the valid split")
        ->capture_default_str();
    sub->add_option("--test-fraction", o_.test_fraction, "fraction of documents for the test split")
        ->capture_default_str();
    sub->add_option("--rows-per-shard", o_.rows_per_shard, "instances per HDF5 file")->capture_default_str();
    sub->add_option("--seed", o_.instances.seed, "the same seed and inputs give the same shards, on any thread count")
        ->capture_default_str();
    sub->add_option("--threads", o_.instances.threads, "worker threads; 0: every core")->capture_default_str();
    sub->add_flag("--quiet", o_.quiet, "no progress lines and no summary");
    sub->add_flag("--overwrite", o_.overwrite, "replace what an earlier run wrote to --out");
    return sub;
  }

  int run(int, char**, std::string&) override {
    o_.lowercase = !cased_;
    o_.instances.mask = masking_ == "static";
    // Unmasked full-sentence rows are the same in every pass: one is the default.
    if (!o_.instances.mask && !o_.instances.next_sentence && dupe_->count() == 0) o_.instances.dupe_factor = 1;
    prep::run_prepare(o_);
    return 0;
  }

 private:
  prep::PrepareOptions o_;
  bool cased_ = false;
  std::string masking_ = "static";
  CLI::Option* dupe_ = nullptr;
};

}  // namespace

std::unique_ptr<Command> prepare_command() { return std::make_unique<Prepare>(); }

}  // namespace cohort::cli
