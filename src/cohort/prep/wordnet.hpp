// defines: WordnetOptions, WordnetCounts, prepare_wordnet
//
// `cohort prepare-classify`: WordNet (Debian's wordnet-base) as a sequence
// classification data set. Each synset is one row of train.tsv, valid.tsv or
// test.tsv with the columns
//   synset   "n.02084071": part of speech and offset, unique
//   pos      noun | verb | adj | adv
//   lexname  its lexicographer file, one of 45 (noun.animal, verb.motion, ...)
//   words    its lemmas, "dog, domestic dog, Canis familiaris"
//   gloss    its definition and examples
// so that gloss -> lexname (supersenses) and gloss -> pos are two tasks
// over one file (data.text-column gloss, data.label-column lexname or pos;
// data.text-pair-column words adds the lemmas as a second segment). The
// split is by synset, a hash of (seed, synset): deterministic, and the same
// whatever else the files hold. Each file is in hash order (shuffled), so
// its first rows are a fair sample.
#pragma once

#include <cstdint>
#include <string>

namespace cohort::prep {

struct WordnetOptions {
  std::string dir = "/usr/share/wordnet";  // data.noun, data.verb, data.adj, data.adv
  std::string out;
  double valid_fraction = 0.1;
  double test_fraction = 0.1;
  uint64_t seed = 1;
  bool overwrite = false;
};

struct WordnetCounts {
  int64_t train = 0, valid = 0, test = 0;
};

// DataError naming the file and line for a malformed data file; UsageError
// when `out` holds files and overwrite is off.
WordnetCounts prepare_wordnet(const WordnetOptions& opts);

}  // namespace cohort::prep
