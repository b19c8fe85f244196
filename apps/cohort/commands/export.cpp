#include <cstdio>
#include <filesystem>

#include "cohort/ckpt/export.hpp"
#include "cohort/core/error.hpp"
#include "cohort/obs/mlflow.hpp"
#include "commands/command.hpp"

namespace cohort::cli {

namespace {

class Export : public Command {
 public:
  CLI::App* add(CLI::App& app) override {
    CLI::App* sub = app.add_subcommand(
        "export", "Write a checkpoint as a standalone model directory: model.safetensors (Hugging Face names), "
                  "config.json and, for BERT, the run's tokenizer; bert-pretrain loads as BertForPreTraining "
                  "(BertForMaskedLM when trained with task.nsp false), "
                  "bert-classify as BertForSequenceClassification");
    sub->add_option("CHECKPOINT", path_, "a run dir (its newest checkpoint) or a checkpoint dir")->required();
    sub->add_option("--out,-o", out_, "directory to write (default RUN_DIR/export)");
    return sub;
  }

  int run(int, char**, std::string&) override {
    ExportResult r = export_model(path_, out_);
    for (const auto& w : r.warnings) std::fprintf(stderr, "cohort: warning: %s\n", w.c_str());
    for (const auto& note : r.notes) std::fprintf(stderr, "cohort: note: %s\n", note.c_str());
    std::printf("cohort: wrote %s: %s\n", r.dir.c_str(), detail::join(r.files, ", ").c_str());
    if (!r.hf_class.empty())
      std::printf("cohort: load it with transformers' %s.from_pretrained('%s') (or the Auto classes)\n",
                  r.hf_class.c_str(), r.dir.c_str());
    if (!r.mlflow.empty() && !r.run_dir.empty()) {  // the export joins the run's MLflow run, under export/
      std::vector<std::pair<std::string, std::string>> files;
      for (const auto& name : r.files) files.emplace_back((std::filesystem::path(r.dir) / name).string(), "export/" + name);
      std::printf("cohort: %s\n", mlflow_upload_to_run(r.mlflow, r.run_dir, files).c_str());
    }
    return 0;
  }

 private:
  std::string path_, out_;
};

}  // namespace

std::unique_ptr<Command> export_command() { return std::make_unique<Export>(); }

}  // namespace cohort::cli
