// defines: PrepareOptions, read_text_documents, read_gcide_documents,
//          gcide_sentences, run_prepare (instances: prep/instances.hpp)
//
// `cohort prepare`: raw text -> vocabulary -> BERT pretraining instances in
// the manner of BERT's create_pretraining_data -> NVIDIA-layout HDF5 shards
// (data/bert_shards.hpp), split train/valid/test by document.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cohort/prep/instances.hpp"

namespace cohort::prep {

struct PrepareOptions {
  std::vector<std::string> inputs;  // text files, or the GCIDE .dict(.dz)
  std::string out;                  // output directory
  std::string tokenizer = "wordpiece";  // wordpiece | bpe (byte-level, text/bpe.hpp)
  std::string vocab;                // existing vocab.txt (wordpiece) or tokenizer.json (bpe); empty: build one
  int32_t vocab_size = 30522;
  bool lowercase = true;
  // Sequence shape and masking. Its seed and threads serve the whole run:
  // the split assignment and each split's instances derive their streams
  // from the seed.
  InstanceOptions instances;
  double valid_fraction = 0.01;  // of documents
  double test_fraction = 0.01;
  int64_t rows_per_shard = 65536;
  bool quiet = false;
  bool overwrite = false;  // replace what an earlier run wrote to `out`
};

// Text files: one sentence per line, a blank line between documents.
// Gzip-compressed files are read too. DataError naming the file.
std::vector<Document> read_text_documents(const std::string& path);
// The GCIDE dictionary (dictd format, .dict or .dict.dz): one entry per
// document, its text split into sentences. Entries are found through the
// dictd index beside it (gcide.index) when there is one, else by layout;
// the 00-database-* entries are skipped. DataError naming the file.
std::vector<Document> read_gcide_documents(const std::string& path);
// One dictd GCIDE entry's text, markup stripped, as sentences.
std::vector<std::string> gcide_sentences(const std::string& entry);

// Runs the whole pipeline; writes OUT/vocab.txt, OUT/manifest.json and
// OUT/{train,valid,test}/part-NNNNN.hdf5 (and for --tokenizer bpe
// OUT/tokenizer.json, with vocab.txt listing its tokens by id). Prints progress (stderr) and a
// summary with MB/s and the [UNK] fraction (stdout) unless quiet. Inputs
// whose names end in .dict or .dict.dz are read as GCIDE, others as text.
// UsageError naming the option for a bad value; UsageError when `out` holds
// files and not `overwrite`.
void run_prepare(const PrepareOptions& opts);

}  // namespace cohort::prep
