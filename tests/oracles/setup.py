"""oracle.setup: GCIDE shards (uncased and cased vocabularies), every GCIDE
sentence as Cohort reads it, a 4-step bert-tiny run with checkpoints and an
export, the same without NSP (dynamic masking) and its export, and a 20-step Fashion-MNIST run with evaluations."""
import os
import shutil

from common import *

shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
prep = [COHORT, "prepare", "--input", GCIDE, "--vocab-size", "2000", "--max-seq-length", "64",
        "--max-predictions", "10", "--dupe-factor", "1", "--quiet"]
run(prep + ["--out", DATA])
run(prep + ["--out", DATA_CASED, "--cased"])
run([TOOL, "gcide-lines", GCIDE, LINES])
run([COHORT, "train", "--config", os.path.join(SOURCE, "examples/bert-tiny.toml"), "--data.path", DATA,
     "--out", BERT_RUN, "--train.max-steps", "4", "--log.every-steps", "2", "--eval.every-steps", "4",
     "--eval.max-samples", "64", "--ckpt.every-steps", "2", "--data.global-batch", "16",
     "--train.precision", "fp32", "--quiet"])
run([COHORT, "export", BERT_RUN, "-o", os.path.join(BERT_RUN, "export")])
run([COHORT, "train", "--config", os.path.join(SOURCE, "examples/bert-tiny.toml"), "--data.path", DATA,
     "--out", BERT_MLM_RUN, "--train.max-steps", "4", "--log.every-steps", "2", "--data.global-batch", "16",
     "--task.nsp=false", "--task.masking", "dynamic", "--task.mask-prob", "0.3",
     "--train.precision", "fp32", "--quiet"])
run([COHORT, "export", BERT_MLM_RUN, "-o", os.path.join(BERT_MLM_RUN, "export")])
run([COHORT, "train", "--config", os.path.join(SOURCE, "examples/fashion-mnist.toml"), "--model.name", "mlp",
     "--out", FMNIST_RUN, "--train.max-steps", "20", "--log.every-steps", "5", "--eval.every-steps", "10",
     "--eval.max-samples", "500", "--data.global-batch", "32", "--quiet"])
print("oracle.setup: ready in", WORK)
