"""Shared by the oracle checks: where things are, and running Cohort.

ctest sets COHORT_BIN, COHORT_ORACLE_TOOL, COHORT_SOURCE_DIR and
COHORT_ORACLE_WORK (tests/CMakeLists.txt). oracle.setup (setup.py) fills
WORK once; each check reads it and exits non-zero with a message on the
first disagreement.
"""
import json
import os
import subprocess
import sys

COHORT = os.environ["COHORT_BIN"]
TOOL = os.environ["COHORT_ORACLE_TOOL"]
SOURCE = os.environ["COHORT_SOURCE_DIR"]
WORK = os.environ["COHORT_ORACLE_WORK"]
GCIDE = "/usr/share/dictd/gcide.dict.dz"

DATA = os.path.join(WORK, "gcide")              # uncased shards + vocab.txt
DATA_CASED = os.path.join(WORK, "gcide-cased")  # cased vocab.txt (and shards)
LINES = os.path.join(WORK, "gcide-lines.txt")   # every GCIDE sentence Cohort reads
BERT_RUN = os.path.join(WORK, "bert")           # bert-tiny, 4 steps, checkpoints + export
BERT_MLM_RUN = os.path.join(WORK, "bert-mlm")   # the same, task.nsp false + dynamic masking, + export
FMNIST_RUN = os.path.join(WORK, "fmnist")       # MLP, 20 steps, train + eval lines


def run(args, **kw):
    """Runs a command; on failure prints its output and exits 1."""
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    if p.returncode != 0:
        fail("%s exited %d:\n%s" % (" ".join(args), p.returncode, p.stdout[-4000:]))
    return p.stdout


def fail(msg):
    print("FAILED: " + msg, file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def prepare_wordnet(name):
    """WordNet glosses labelled by lexicographer file (cohort prepare-classify)
    in WORK/name; exits 77 (SKIPPED) when wordnet-base is not installed."""
    if not os.path.exists("/usr/share/wordnet/data.noun"):
        print("%s: SKIPPED (wordnet-base is not installed)" % os.path.basename(sys.argv[0]))
        sys.exit(77)
    out = os.path.join(WORK, name)
    run([COHORT, "prepare-classify", "--out", out, "--overwrite"])
    return out
