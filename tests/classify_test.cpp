// bert-classify: the TSV/JSONL reader and its errors, WordNet as a data set,
// fine-tuning from a pretraining checkpoint, metrics and predictions that
// are identical at any world size, the best checkpoint, eval and predict.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <set>

#include "cohort/ckpt/checkpoint.hpp"
#include "cohort/config/config.hpp"
#include "cohort/core/error.hpp"
#include "cohort/data/text_classify.hpp"
#include "cohort/distributed/comm.hpp"
#include "cohort/distributed/rendezvous.hpp"
#include "cohort/prep/wordnet.hpp"
#include "cohort/text/wordpiece.hpp"
#include "cohort/train/lifecycle/run.hpp"
#include "cohort/train/loop/evaluate.hpp"
#include "cohort/train/task.hpp"
#include "helpers.hpp"
#include "thread_world.hpp"

using namespace cohort;
using namespace cohort::text;
using namespace cohort::prep;
using cohort::test::error_of;
using cohort::test::read_file;
using cohort::test::run_cohort;
using cohort::test::TempDir;
using cohort::test::write_file;

namespace {

WordPiece tiny_tokenizer() {
  std::vector<std::string> tokens = special_tokens();
  for (const char* w : {"the", "cat", "sat", "on", "a", "mat", "dog", "ran", "to", "park", "."}) tokens.push_back(w);
  return WordPiece(Vocab(tokens), TokenizerOptions{});
}

std::string error_reading(const std::string& path, const LabelSet& labels = {}, const std::string& pair = "") {
  WordPiece wp = tiny_tokenizer();
  TextClassifyOptions o;
  o.columns.text_pair = pair;
  return error_of([&] { TextClassification(path, wp, o, labels); });
}

// The tiny corpus's sentences as a 3-class task: which animal a sentence
// names first (or none).
void write_animal_tsvs(const TempDir& tmp, const std::string& dir) {
  std::filesystem::create_directories(dir);
  const char* words[] = {"the", "cat", "sat", "on", "a", "mat", "dog", "ran", "to", "park", "bird", "sang"};
  for (const char* split : {"train", "valid", "test"}) {
    std::string tsv = "id\tsentence\tanimal\n";
    int rows = std::string(split) == "train" ? 240 : 60;
    for (int i = 0; i < rows; ++i) {
      int seed = i * 7 + (split[0] == 't' && split[1] == 'e' ? 5000 : split[0] == 'v' ? 9000 : 0);
      std::string sentence, label = "none";
      for (int w = 0; w < 6; ++w) {
        std::string word = words[(seed * 13 + w * w * 5 + w) % 12];
        if (label == "none" && (word == "cat" || word == "dog" || word == "bird")) label = word == "bird" ? "dog" : word;
        sentence += (w ? " " : "") + word;
      }
      tsv += std::to_string(i) + "\t" + sentence + "\t" + label + "\n";
    }
    write_file(dir + "/" + split + ".tsv", tsv);
  }
  (void)tmp;
}

}  // namespace

TEST(TextClassify, ReadsTsvAndJsonlWithPairsAndTruncatesTheLongerFirst) {
  TempDir tmp;
  write_file(tmp / "train.tsv", "text\tsecond\tlabel\nthe cat sat on the mat\tthe dog\tyes\nthe dog ran\ta cat\tno\n");
  WordPiece wp = tiny_tokenizer();
  TextClassifyOptions o;
  o.columns.text_pair = "second";
  o.max_seq_length = 8;  // 5 text tokens: "the cat sat on the mat" (6) + "the dog" (2) cut, longer first, to 3 + 2
  TextClassification data(tmp / "train.tsv", wp, o);
  ASSERT_EQ(data.size(), 2);
  EXPECT_EQ(data.labels().names(), (std::vector<std::string>{"no", "yes"}));
  auto b = data.get_batch({0, 1});
  const int64_t cls = wp.vocab().find("[CLS]"), sep = wp.vocab().find("[SEP]"), the = wp.vocab().find("the");
  auto ids = b.at("input_ids");
  ASSERT_EQ(ids.size(1), 8);
  EXPECT_EQ(ids[0][0].item<int64_t>(), cls);
  EXPECT_EQ(ids[0][3].item<int64_t>(), wp.vocab().find("sat"));
  EXPECT_EQ(ids[0][4].item<int64_t>(), sep);  // "on the mat" was cut
  EXPECT_EQ(ids[0][5].item<int64_t>(), the);  // "the dog", whole
  EXPECT_EQ(ids[0][7].item<int64_t>(), sep);
  EXPECT_EQ(b.at("segment_ids")[0].sum().item<int64_t>(), 3);  // the dog [SEP]
  EXPECT_EQ(b.at("input_mask")[1].sum().item<int64_t>(), 8);   // 3 + 2 + 3 specials: nothing cut
  EXPECT_EQ(b.at("label")[0].item<int64_t>(), 1);
  // The same data as JSONL.
  write_file(tmp / "train.jsonl", "{\"text\": \"the cat sat on the mat\", \"second\": \"the dog\", \"label\": \"yes\"}\n"
                                  "{\"text\": \"the dog ran\", \"second\": \"a cat\", \"label\": \"no\"}\n");
  TextClassification json(tmp / "train.jsonl", wp, o);
  EXPECT_TRUE(torch::equal(json.get_batch({0, 1}).at("input_ids"), ids));
  EXPECT_EQ(classify_file(tmp.path(), "train"), tmp / "train.tsv");
}

TEST(TextClassify, BadInputIsOneErrorNamingTheFileAndLine) {
  TempDir tmp;
  write_file(tmp / "a.tsv", "sentence\tlabel\nthe cat\tyes\n");
  EXPECT_NE(error_reading(tmp / "a.tsv").find(tmp / "a.tsv" + ":1: no column 'text' in the header (it has: sentence, label)"),
            std::string::npos) << error_reading(tmp / "a.tsv");
  write_file(tmp / "b.tsv", "");
  EXPECT_NE(error_reading(tmp / "b.tsv").find(tmp / "b.tsv" + ": empty file"), std::string::npos);
  write_file(tmp / "c.tsv", "text\tlabel\nthe cat\tyes\nthe dog\tyes\n");
  EXPECT_NE(error_reading(tmp / "c.tsv").find("has only one class ('yes')"), std::string::npos) << error_reading(tmp / "c.tsv");
  write_file(tmp / "d.tsv", "text\tlabel\nthe cat\tyes\nthe dog\tmaybe\n");
  EXPECT_NE(error_reading(tmp / "d.tsv", LabelSet({"no", "yes"})).find(tmp / "d.tsv" + ":3: label 'maybe' is not one of the train split's 2 labels"),
            std::string::npos) << error_reading(tmp / "d.tsv", LabelSet({"no", "yes"}));
  write_file(tmp / "e.tsv", "text\tlabel\nthe cat\tyes\textra\n");
  EXPECT_NE(error_reading(tmp / "e.tsv").find(tmp / "e.tsv" + ":2: 3 field(s), but the header has 2"), std::string::npos);
  write_file(tmp / "f.tsv", "text\tlabel\n");
  EXPECT_NE(error_reading(tmp / "f.tsv").find(": no rows"), std::string::npos);
  write_file(tmp / "g.jsonl", "{\"text\": \"the cat\", \"label\": \"a\"}\n{\"label\": \"b\"}\n");
  EXPECT_NE(error_reading(tmp / "g.jsonl").find(tmp / "g.jsonl" + ":2: no field 'text'"), std::string::npos);
  EXPECT_NE(error_of([&] { classify_file(tmp / "nowhere", "train"); }).find("has no train.tsv or train.jsonl"),
            std::string::npos);
}

TEST(Wordnet, SupersensesAndPartsOfSpeechSplitBySynset) {
  if (!std::filesystem::exists("/usr/share/wordnet/data.noun")) GTEST_SKIP() << "SKIPPED: wordnet-base is not installed";
  TempDir tmp;
  auto r = run_cohort("prepare-classify --out " + tmp / "wn");
  ASSERT_EQ(r.code, 0) << r.err;
  WordPiece wp = tiny_tokenizer();
  TextClassifyOptions o;
  o.columns = {"gloss", "", "lexname", ""};
  TextClassification train(tmp / "wn/train.tsv", wp, o);
  EXPECT_EQ(train.labels().size(), 45);
  EXPECT_GT(train.size(), 90000);
  TextClassification test(tmp / "wn/test.tsv", wp, o, train.labels());
  EXPECT_NEAR(static_cast<double>(test.size()) / (train.size() / 0.8), 0.1, 0.01);
  o.columns.label = "pos";
  EXPECT_EQ(TextClassification(tmp / "wn/valid.tsv", wp, o).labels().names(),
            (std::vector<std::string>{"adj", "adv", "noun", "verb"}));
  // Deterministic, and no synset in two splits.
  auto again = run_cohort("prepare-classify --out " + tmp / "wn2");
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(read_file(tmp / "wn/test.tsv"), read_file(tmp / "wn2/test.tsv"));
  std::set<std::string> ids;
  for (const char* s : {"train", "valid", "test"}) {
    for (const auto& line : cohort::test::lines_of(read_file(tmp / "wn/" + s + ".tsv"))) {
      EXPECT_TRUE(ids.insert(line.substr(0, line.find('\t'))).second || line.rfind("synset", 0) == 0) << line;
    }
  }
  std::string all = read_file(tmp / "wn/train.tsv") + read_file(tmp / "wn/valid.tsv") + read_file(tmp / "wn/test.tsv");
  EXPECT_NE(all.find("noun\tnoun.animal\tdog, domestic dog, Canis familiaris\ta member of the genus Canis"),
            std::string::npos);
  EXPECT_NE(run_cohort("prepare-classify --out " + tmp / "wn").err.find("exists; pass --overwrite"), std::string::npos);
}

// Pretrain a tiny BERT, fine-tune it on a 3-class task, then check what a
// fine-tuning user relies on.
TEST(BertClassify, FineTunesFromAPretrainingCheckpointWithMetricsIdenticalAtAnyWorldSize) {
  TempDir tmp;
  ASSERT_EQ(cohort::test::prepare_tiny_bert(tmp).code, 0);
  const std::string shape = " --model.name bert --model.hidden 32 --model.layers 2 --model.heads 2"
                            " --model.max-positions 64";
  auto pre = run_cohort("train --quiet --train.task bert-pretrain" + shape + " --data.path " + tmp / "data" +
                        " --data.global-batch 16 --train.max-steps 2 --eval.split valid --out " + tmp / "pre");
  ASSERT_EQ(pre.code, 0) << pre.err;
  write_animal_tsvs(tmp, tmp / "animals");
  // No data.vocab: the vocabulary comes from the pretraining run's tokenizer/.
  const std::string classify = "train --train.task bert-classify" + shape + " --data.path " + tmp / "animals" +
                               " --data.text-column sentence"
                               " --data.label-column animal --data.max-seq-length 32 --data.global-batch 24 --optim.lr 0.002"
                               " --eval.split valid --eval.every-steps 10 --ckpt.best-metric macro_f1";
  auto fine = run_cohort(classify + " --train.max-steps 30 --model.init " + tmp / "pre --out " + tmp / "fine");
  ASSERT_EQ(fine.code, 0) << fine.err;
  EXPECT_NE(fine.out.find("model.init: initialised (not in the file): classifier.weight, classifier.bias"),
            std::string::npos) << fine.out;
  EXPECT_NE(fine.out.find("model.init: left out (not in this model): cls."), std::string::npos) << fine.out;
  EXPECT_NE(fine.out.find("macro_f1"), std::string::npos) << fine.out;
  EXPECT_EQ(fine.out.find("f1/cat"), std::string::npos) << "per-class F1 stays out of the console";
  EXPECT_NE(read_file(tmp / "fine/metrics.jsonl").find("\"f1/cat\""), std::string::npos);
  EXPECT_EQ(LabelSet::from_json(read_file(tmp / "fine/labels.json"), "labels.json").names(),
            (std::vector<std::string>{"cat", "dog", "none"}));
  auto best = Checkpoints::best(tmp / "fine");
  ASSERT_GE(best.step, 10);
  EXPECT_EQ(best.metric, "macro_f1");
  EXPECT_TRUE(std::filesystem::exists(tmp / "fine/checkpoints/" + Checkpoints::dir_name(best.step)));
  // A shape mismatch names the tensor.
  std::string other_shape = classify;  // each key once: a key given twice is a usage error
  other_shape.replace(other_shape.find("--model.hidden 32"), 17, "--model.hidden 64");
  auto wrong = run_cohort(other_shape + " --train.max-steps 1 --model.init " + tmp / "pre --out " +
                          tmp / "wrong");
  EXPECT_EQ(wrong.code, 2) << wrong.err;
  EXPECT_NE(wrong.err.find("tensor 'bert.embeddings.word_embeddings.weight' has shape ["), std::string::npos) << wrong.err;
  EXPECT_NE(wrong.err.find(", 32] but the model's 'bert.embeddings.word_embeddings.weight' is ["), std::string::npos)
      << wrong.err;

  // Eval metrics on the final checkpoint at world sizes 1, 2 and 3.
  EvalRequest req;
  req.checkpoint = tmp / "fine";
  req.split = "test";
  EvalPlan plan = plan_evaluation(req);
  std::vector<std::vector<std::pair<std::string, double>>> metrics;
  std::vector<std::vector<nlohmann::json>> predictions;
  for (int n : {1, 2, 3}) {
    std::vector<std::pair<std::string, double>> got;
    std::string out = tmp / ("predict-" + std::to_string(n) + ".jsonl");
    cohort::test::spawn_world(n, [&](Comm& comm) {
      int rank = comm.rank();
      auto task = make_task(plan.cfg, comm.world());
      load_model_weights(*task->module(), plan.run.checkpoint()->dir + "/model.safetensors");
      Tally tally = evaluate(*task, *task->eval_set("test"), comm, {7, 0, {}});  // batches of 7: ragged shares
      if (rank == 0) got = task->report(tally);
      predict_checkpoint(plan.cfg, comm, plan.run, tmp / "animals/test.tsv", out);
    });
    metrics.push_back(got);
    predictions.emplace_back();
    for (const auto& line : cohort::test::lines_of(read_file(out))) predictions.back().push_back(nlohmann::json::parse(line));
  }
  ASSERT_GE(metrics[0].size(), 6u);  // loss, accuracy, macro_f1, f1 per class
  for (size_t k = 1; k < 3; ++k) {
    ASSERT_EQ(metrics[k].size(), metrics[0].size());
    for (size_t i = 0; i < metrics[0].size(); ++i) {
      EXPECT_EQ(metrics[k][i].first, metrics[0][i].first);
      if (metrics[0][i].first == "loss") EXPECT_NEAR(metrics[k][i].second, metrics[0][i].second, 1e-6);  // fp32 sums
      else EXPECT_EQ(metrics[k][i].second, metrics[0][i].second) << metrics[0][i].first << " at world " << k + 1;
    }
    ASSERT_EQ(predictions[k].size(), 60u);
    for (size_t i = 0; i < 60; ++i) {
      EXPECT_EQ(predictions[k][i]["index"], i);
      EXPECT_EQ(predictions[k][i]["label"], predictions[0][i]["label"]);
      EXPECT_NEAR(predictions[k][i]["probability"].get<double>(), predictions[0][i]["probability"].get<double>(), 1e-6);
    }
  }
  EXPECT_EQ(predictions[0][0]["probabilities"].size(), 3u);
  EXPECT_TRUE(predictions[0][0].contains("true_label"));

  // cohort eval prints per-class F1 and writes the confusion matrix to a
  // file; cohort predict writes a line per input.
  // cohort eval's line goes to TensorBoard too (a file of its own beside the
  // run's), and --plot draws the confusion matrix as a heatmap.
  auto event_files = [&] {
    size_t n = 0;
    for (const auto& e : std::filesystem::directory_iterator(tmp / "fine/tensorboard")) n += e.is_regular_file();
    return n;
  };
  const size_t events_before = event_files();
  auto eval = run_cohort("eval " + tmp / "fine --split test --plot");
  ASSERT_EQ(eval.code, 0) << eval.err;
  // The terminal gets a per-class summary; the matrix goes to a file.
  EXPECT_NE(eval.out.find(" of 3 classes in the split or predicted): "), std::string::npos) << eval.out;
  EXPECT_EQ(eval.out.find("confusion matrix (rows: true label"), std::string::npos) << eval.out;
  EXPECT_NE(eval.out.find("cohort: confusion matrix: " + tmp / "fine/confusion-test-step-30.txt"), std::string::npos)
      << eval.out;
  EXPECT_NE(read_file(tmp / "fine/confusion-test-step-30.txt").find("confusion matrix (rows: true label"),
            std::string::npos);
  EXPECT_EQ(event_files(), events_before + 1);
  if (std::system("command -v gnuplot >/dev/null 2>&1") == 0) {
    EXPECT_TRUE(std::filesystem::exists(tmp / "fine/confusion-test-step-30.png")) << eval.out;
    EXPECT_NE(read_file(tmp / "fine/.plot/confusion.gp").find("with image"), std::string::npos);
  }
  // The CLI on several ranks and nodes, as train runs: the same eval line
  // from 3 ranks, the same prediction lines from 2 nodes of one rank each.
  auto eval_lines = [&] {
    std::vector<nlohmann::json> out;
    for (const auto& l : cohort::test::lines_of(read_file(tmp / "fine/metrics.jsonl"))) {
      auto j = nlohmann::json::parse(l);
      if (j["kind"] == "eval" && j["split"] == "test") out.push_back(j);
    }
    return out;
  };
  auto eval3 = run_cohort("eval " + tmp / "fine --split test --nproc-per-node 3 --oversubscribe");
  ASSERT_EQ(eval3.code, 0) << eval3.err;
  auto evals = eval_lines();
  ASSERT_EQ(evals.size(), 2u);
  // The second evaluation of step 30 says it goes beside the first, and each is marked.
  EXPECT_NE(eval3.out.find("metrics.jsonl already holds 1 test evaluation(s) of step 30: this one is added beside"),
            std::string::npos) << eval3.out;
  EXPECT_EQ(evals[0].value("source", ""), "cohort eval");
  for (const auto& [key, value] : evals[0].items()) {
    if (key == "loss") EXPECT_NEAR(evals[1][key].get<double>(), value.get<double>(), 1e-6);
    else EXPECT_EQ(evals[1][key], value) << key << " on 3 ranks";
  }
  EXPECT_EQ(evals[1].size(), evals[0].size());
  const auto eval_at = eval3.out.find("eval  step 30  test:");
  EXPECT_NE(eval_at, std::string::npos) << eval3.out;
  EXPECT_EQ(eval3.out.find("eval  step 30  test:", eval_at + 1), std::string::npos) << "rank 0 alone reports:\n" << eval3.out;
  auto single = run_cohort("predict " + tmp / "fine --input " + tmp / "animals/test.tsv --out " + tmp / "p1.jsonl");
  ASSERT_EQ(single.code, 0) << single.err;
  {
    const std::string node = std::string(COHORT_BIN) + " predict " + tmp / "fine --input " + tmp / "animals/test.tsv --out " +
                             tmp / "p2.jsonl --nnodes 2 --init-method file://" + tmp / "rdzv --node-rank ";
    cohort::test::Background n0(node + "0", tmp, "node0"), n1(node + "1", tmp, "node1");
    ASSERT_EQ(n0.wait(std::chrono::minutes(5)), 0) << n0.err();
    ASSERT_EQ(n1.wait(std::chrono::minutes(5)), 0) << n1.err();
    EXPECT_NE(n0.out().find("wrote 60 predictions"), std::string::npos) << n0.out();
    EXPECT_EQ(n1.out().find("wrote"), std::string::npos) << "only rank 0 writes: " << n1.out();
  }
  auto by_rank = cohort::test::lines_of(read_file(tmp / "p2.jsonl"));
  auto alone = cohort::test::lines_of(read_file(tmp / "p1.jsonl"));
  ASSERT_EQ(by_rank.size(), alone.size());
  for (size_t i = 0; i < alone.size(); ++i) {
    auto a = nlohmann::json::parse(alone[i]), b = nlohmann::json::parse(by_rank[i]);
    EXPECT_EQ(b["index"], a["index"]);
    EXPECT_EQ(b["text"], a["text"]);
    EXPECT_EQ(b["label"], a["label"]) << "line " << i;
    EXPECT_NEAR(b["probability"].get<double>(), a["probability"].get<double>(), 1e-6) << "line " << i;
  }

  write_file(tmp / "inputs.jsonl", "{\"sentence\": \"the cat sat\"}\n{\"sentence\": \"a dog ran to the park\"}\n");
  auto predict = run_cohort("predict " + tmp / "fine --input " + tmp / "inputs.jsonl --out " + tmp / "p.jsonl");
  ASSERT_EQ(predict.code, 0) << predict.err;
  auto lines = cohort::test::lines_of(read_file(tmp / "p.jsonl"));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_FALSE(nlohmann::json::parse(lines[0]).contains("true_label"));
  EXPECT_EQ(nlohmann::json::parse(lines[1])["text"], "a dog ran to the park") << lines[1];

  // Inputs whose columns are named otherwise: the error names the flag, and
  // the flag works; an id column goes beside each prediction instead of the text.
  write_file(tmp / "renamed.jsonl", "{\"words\": \"the cat sat\", \"key\": \"a1\"}\n");
  auto missing = run_cohort("predict " + tmp / "fine --input " + tmp / "renamed.jsonl --out " + tmp / "q.jsonl");
  EXPECT_EQ(missing.code, 1) << missing.err;
  EXPECT_NE(missing.err.find("no field 'sentence'; set data.text-column"), std::string::npos) << missing.err;
  auto renamed = run_cohort("predict " + tmp / "fine --input " + tmp / "renamed.jsonl --data.text-column words"
                            " --data.id-column key --out " + tmp / "q.jsonl");
  ASSERT_EQ(renamed.code, 0) << renamed.err;
  auto line = nlohmann::json::parse(cohort::test::lines_of(read_file(tmp / "q.jsonl")).at(0));
  EXPECT_EQ(line["id"], "a1") << line;
  EXPECT_FALSE(line.contains("text")) << line;
  EXPECT_EQ(line["label"], nlohmann::json::parse(lines[0])["label"]) << "the same text, the same label";

  // The classifier exports as BertForSequenceClassification, with the run's
  // labels and the tokenizer it trained with.
  auto exported = run_cohort("export " + tmp / "fine");
  ASSERT_EQ(exported.code, 0) << exported.err;
  EXPECT_NE(exported.out.find("BertForSequenceClassification.from_pretrained"), std::string::npos) << exported.out;
  auto config = nlohmann::json::parse(read_file(tmp / "fine/export/config.json"));
  EXPECT_EQ(config["architectures"][0], "BertForSequenceClassification");
  EXPECT_EQ(config["num_labels"], 3);
  EXPECT_EQ(config["id2label"], nlohmann::json::parse(R"({"0": "cat", "1": "dog", "2": "none"})"));
  EXPECT_EQ(config["label2id"], nlohmann::json::parse(R"({"cat": 0, "dog": 1, "none": 2})"));
  EXPECT_EQ(read_file(tmp / "fine/export/vocab.txt"), read_file(tmp / "data/vocab.txt"));
  auto tokenizer = nlohmann::json::parse(read_file(tmp / "fine/export/tokenizer_config.json"));
  EXPECT_EQ(tokenizer["do_lower_case"], true);
  EXPECT_EQ(tokenizer["model_max_length"], 64);
  EXPECT_TRUE(std::filesystem::exists(tmp / "fine/export/special_tokens_map.json"));
  // The plot draws per-class F1 as one sorted bar chart, not a line per class.
  if (std::system("command -v gnuplot >/dev/null 2>&1") == 0) {
    auto plot = run_cohort("plot " + tmp / "fine");
    ASSERT_EQ(plot.code, 0) << plot.err;
    std::string script = read_file(tmp / "fine/.plot/plot.gp");
    EXPECT_NE(script.find("set title 'per-class F1 at step 30 (valid, 3 classes, best first)'"), std::string::npos) << script;
    EXPECT_NE(script.find("with boxes"), std::string::npos) << script;
    EXPECT_NE(script.find("set title 'macro F1'"), std::string::npos) << script;
  }
  auto weights = load_safetensors(tmp / "fine/export/model.safetensors");
  EXPECT_EQ(weights.tensors.count("classifier.weight"), 1u);
  EXPECT_EQ(weights.tensors.count("cls.predictions.bias"), 0u);
}
