#include <cstdio>

#include "cohort/prep/wordnet.hpp"
#include "commands/command.hpp"

namespace cohort::cli {

namespace {

class PrepareClassify : public Command {
 public:
  CLI::App* add(CLI::App& app) override {
    CLI::App* sub = app.add_subcommand(
        "prepare-classify", "Write WordNet (wordnet-base) as sequence classification TSVs, split by synset: "
                            "train/valid/test.tsv with columns synset, pos, lexname, words, gloss");
    sub->add_option("--wordnet", o_.dir, "WordNet's dict directory")->capture_default_str();
    sub->add_option("--out", o_.out, "directory to write")->required();
    sub->add_option("--valid-fraction", o_.valid_fraction, "synsets in valid.tsv")->capture_default_str();
    sub->add_option("--test-fraction", o_.test_fraction, "synsets in test.tsv")->capture_default_str();
    sub->add_option("--seed", o_.seed, "seed of the split")->capture_default_str();
    sub->add_flag("--overwrite", o_.overwrite, "replace existing files");
    return sub;
  }

  int run(int, char**, std::string&) override {
    prep::WordnetCounts n = prep::prepare_wordnet(o_);
    std::printf("cohort: wrote %s/{train,valid,test}.tsv: %lld, %lld, %lld synsets\n", o_.out.c_str(),
                static_cast<long long>(n.train), static_cast<long long>(n.valid), static_cast<long long>(n.test));
    return 0;
  }

 private:
  prep::WordnetOptions o_;
};

}  // namespace

std::unique_ptr<Command> prepare_classify_command() { return std::make_unique<PrepareClassify>(); }

}  // namespace cohort::cli
