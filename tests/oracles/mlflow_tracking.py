"""oracle.mlflow_tracking: log.mlflow against a real MLflow tracking server
(`mlflow server` from the venv, on loopback, SQLite and a local artifact
store), read back with MLflow's own MlflowClient.

1. A bert-classify run on WordNet with log.mlflow: the run is FINISHED, its
   params are config.toml's values, and every number of every metrics.jsonl
   line is in MLflow at its step (train/loss, test/f1/noun.animal, ...),
   equal to the file's. config.toml, metrics.jsonl, labels.json and
   plots.png are artifacts.
2. `cohort eval --plot` adds its metrics and the confusion heatmap to the
   same run; `cohort export` adds the export under export/, and that copy,
   downloaded from MLflow, loads into pipeline("text-classification").
3. A resume continues the same MLflow run to its new last step.
4. The server is killed mid-run (the job held at a step by COHORT_DEBUG_GATE
   until the server has every value so far): training finishes, and the
   warning names exactly what was not sent: started again on the same
   store, the server holds every value of metrics.jsonl except those.
5. The server hangs mid-run (SIGSTOP): the job exits within the promised
   60 s of its last step, naming what was never sent and what was sent but
   not answered (the run's status among them); woken
   (SIGCONT), the server holds every acknowledged value and none of those
   never sent.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.request

from common import *

os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
import mlflow  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

HOME = os.path.join(WORK, "mlflow")
shutil.rmtree(HOME, ignore_errors=True)
os.makedirs(HOME)


class Server:
    """`mlflow server` in its own process group, on a free loopback port."""

    def __init__(self, name):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.uri = "http://127.0.0.1:%d" % self.port
        env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
        self.log = open(os.path.join(HOME, name + ".log"), "w")
        mlflow_bin = os.path.join(os.path.dirname(sys.executable), "mlflow")
        self.proc = subprocess.Popen(
            [mlflow_bin, "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
             "--backend-store-uri", "sqlite:///" + os.path.join(HOME, "store.sqlite"),
             "--artifacts-destination", os.path.join(HOME, "artifacts")],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        # The event: the server answers. The limit is for a broken install.
        deadline = time.time() + 300
        while True:
            check(self.proc.poll() is None, "mlflow server exited:\n" + open(self.log.name).read()[-3000:])
            try:
                if urllib.request.urlopen(self.uri + "/health", timeout=5).status == 200:
                    break
            except OSError:
                pass
            check(time.time() < deadline, "mlflow server did not answer in 300 s")
            time.sleep(0.2)
        print("mlflow server at %s (pid %d)" % (self.uri, self.proc.pid))

    def kill(self):
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def numbers(line, prefix, out):
    """metrics.jsonl's numbers as MLflow keys, as Cohort names them: the rate
    by its unit (train/samples_per_s for a classifier)."""
    for key, value in line.items():
        if "/" not in prefix and key in ("kind", "step", "split", "unit", "balance", "source"):
            continue  # the line's own fields (phase_ms has a "step" of its own)
        name = prefix + "/" + key
        if "/" not in prefix and key == "tokens_per_s" and "unit" in line:
            name = prefix + "/" + line["unit"] + "_per_s"
        if isinstance(value, dict):
            numbers(value, name, out)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[re.sub(r"[^A-Za-z0-9_\-./ ]", "_", name)] = float(value)


def expected(run_dir):
    """{key: [(step, value), ...]} from metrics.jsonl, in file order."""
    want = {}
    for line in metrics(run_dir):
        if line["kind"] not in ("train", "eval"):
            continue
        values = {}
        numbers(line, "train" if line["kind"] == "train" else line["split"], values)
        for key, value in values.items():
            want.setdefault(key, []).append((line["step"], value))
    return want


def history(client, run_id, keys):
    return {k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k)) for k in keys}


def same(a, b):
    return len(a) == len(b) and all(s == t and abs(x - y) <= 1e-9 * max(1.0, abs(x)) for (s, x), (t, y) in zip(a, b))


def check_metrics(client, run_id, run_dir):
    want = expected(run_dir)
    got = history(client, run_id, want)
    for key in want:
        check(same(sorted(want[key]), got[key]), "%s: metrics.jsonl has %s, MLflow %s" % (key, want[key][:5], got[key][:5]))
    return sum(len(v) for v in want.values()), len(want)


def artifacts(client, run_id, path=None):
    return sorted(a.path for a in client.list_artifacts(run_id, path))


server = Server("server")
client = MlflowClient(server.uri)
track = ["--log.mlflow", server.uri, "--log.mlflow-experiment", "cohort-oracle"]

# --- 1. a fine-tuning run, tracked -----------------------------------------------
try:
    wordnet = prepare_wordnet("mlflow-wordnet")
except SystemExit:
    server.kill()
    raise
fine = os.path.join(HOME, "wn-tiny")
fine_args = ["--config", os.path.join(SOURCE, "examples/bert-tiny-classify-wordnet.toml"),
             "--model.init", BERT_RUN, "--data.path", wordnet, "--data.vocab", os.path.join(DATA, "vocab.txt"),
             "--train.precision", "fp32", "--log.every-steps", "5", "--eval.every-steps", "10",
             "--eval.max-samples", "64", "--data.global-batch", "32", "--log.tensorboard=false", "--quiet"]
out = run([COHORT, "train"] + fine_args + track + ["--train.max-steps", "20", "--log.mlflow-run-name", "wn-tiny",
                                                  "--out", fine])
check("warning" not in out, "a healthy server gave warnings:\n" + out)
record = json.load(open(os.path.join(fine, "mlflow.json")))
run_id = record["run_id"]
check("cohort: mlflow: " + record["run_page"] in out, "training did not print the run's page:\n" + out)
r = client.get_run(run_id)
check(r.info.status == "FINISHED", "the run is %s, not FINISHED" % r.info.status)
check(r.info.run_name == "wn-tiny", "run name %r" % r.info.run_name)
check(client.get_experiment(r.info.experiment_id).name == "cohort-oracle", "wrong experiment")
config = {}
section = ""
for line in open(os.path.join(fine, "config.toml")):
    line = line.rstrip("\n")
    if line.startswith("["):
        section = line[1:-1]
    elif " = " in line and not line.startswith("#"):
        key, value = line.split(" = ", 1)
        config[section + "." + key] = value[1:-1] if value.startswith('"') and value.endswith('"') else value
check(r.data.params == config, "params differ from config.toml: %s" %
      sorted(set(r.data.params.items()) ^ set(config.items()))[:6])
values, keys = check_metrics(client, run_id, fine)
check(any("/f1/" in k for k in expected(fine)), "no per-class F1 in the run")
print("1. training: %d params; %d values of %d metrics equal metrics.jsonl's" % (len(config), values, keys))
files = artifacts(client, run_id)
wanted = ["config.toml", "labels.json", "metrics.jsonl"] + (["plots.png"] if shutil.which("gnuplot") else [])
check(all(f in files for f in wanted), "artifacts %s, want %s" % (files, wanted))
print("   artifacts: %s" % ", ".join(files))

# --- 2. eval and export join the run ----------------------------------------------
out = run([COHORT, "eval", fine, "--split", "test"] + (["--plot"] if shutil.which("gnuplot") else []))
check("warning" not in out, out)
values, keys = check_metrics(client, run_id, fine)
check(client.get_run(run_id).info.status == "FINISHED", "eval changed the run's status")
if shutil.which("gnuplot"):
    check(any(f.startswith("confusion-") for f in artifacts(client, run_id)), "no confusion heatmap in MLflow")
out = run([COHORT, "export", fine])
check("mlflow: sent" in out, "export did not go to MLflow:\n" + out)
exported = artifacts(client, run_id, "export")
check("export/model.safetensors" in exported and "export/config.json" in exported, "export artifacts: %s" % exported)
local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="export", dst_path=os.path.join(HOME, "dl"),
                                            tracking_uri=server.uri)
from transformers import pipeline  # noqa: E402
label = pipeline("text-classification", model=local, device="cpu")("a small domesticated carnivore")[0]
check(label["label"] in json.load(open(os.path.join(fine, "labels.json")))["labels"], "pipeline gave %r" % label)
print("2. eval: %d values equal; export: %d files, downloaded from MLflow, pipeline says %s %.3f" %
      (values, len(exported), label["label"], label["score"]))

# --- 3. a resume continues the run ------------------------------------------------
run([COHORT, "train", "--resume", fine, "--train.max-steps", "30", "--quiet"])
check(json.load(open(os.path.join(fine, "mlflow.json")))["run_id"] == run_id, "the resume started a new MLflow run")
r = client.get_run(run_id)
check(r.info.status == "FINISHED", "after the resume the run is %s" % r.info.status)
steps = [m.step for m in client.get_metric_history(run_id, "train/loss")]
check(max(steps) == 30, "train/loss reaches step %d, not 30" % max(steps))
check(r.data.params["train.max-steps"] == "20", "a param changed: MLflow keeps the first value")
print("3. resume: the same run goes on to step %d" % max(steps))

# --- 4. the server dies mid-run -----------------------------------------------------
gate = os.path.join(HOME, "gate")


def held_job(name, server, client):
    """A fashion-mnist run of 30 steps tracked on `server`, held before step
    11 (COHORT_DEBUG_GATE) once the server has every value so far (the
    event). Returns the process, its run dir and its MLflow run id."""
    with open(gate, "w") as f:
        f.write("10")
    out = os.path.join(HOME, name)
    args = ["--config", os.path.join(SOURCE, "examples/fashion-mnist.toml"), "--model.name", "mlp",
            "--train.max-steps", "30", "--log.every-steps", "5", "--eval.every-steps", "10", "--eval.max-samples", "200",
            "--data.global-batch", "32", "--log.tensorboard=false", "--quiet", "--out", out,
            "--log.mlflow", server.uri, "--log.mlflow-experiment", "cohort-oracle", "--log.mlflow-run-name", name]
    job = subprocess.Popen([COHORT, "train"] + args, env=dict(os.environ, COHORT_DEBUG_GATE=gate),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 600
    while True:
        if job.poll() is not None:
            fail("the job ended early: %s" % (job.communicate(),))
        if os.path.exists(os.path.join(out, "mlflow.json")) and os.path.exists(os.path.join(out, "metrics.jsonl")):
            rid = json.load(open(os.path.join(out, "mlflow.json")))["run_id"]
            want = expected(out)
            if any(s == 10 for s, _ in want.get("test/loss", [])):
                got = history(client, rid, want)
                if all(same(sorted(want[k]), got[k]) for k in want):
                    return job, out, rid
        check(time.time() < deadline, "the server never had steps 1-10")
        time.sleep(0.2)


job, killed, rid = held_job("killed", server, client)
sent_before = sum(len(v) for v in expected(killed).values())
server.kill()
with open(gate, "w") as f:
    f.write("1000")
stdout, stderr = job.communicate(timeout=600)
check(job.returncode == 0, "training did not finish after the server died (exit %d):\n%s" % (job.returncode, stderr))
print("4. server killed at step 10; the job finished. Its warnings:\n   " + "\n   ".join(stderr.strip().split("\n")))
check(stderr.count("warning: mlflow:") == 2, "want one warning at the failure and one account at the end")
m = re.search(r"not sent to \S+: (\d+) metric value\(s\) \(([^;]*); steps (\d+)-(\d+)\), (\d+) artifact\(s\) \(([^)]*)\), "
              r"the run's final status FINISHED", stderr)
check(m is not None, "the account does not name what was lost:\n" + stderr)
lost, first, last = int(m.group(1)), int(m.group(3)), int(m.group(4))
total = sum(len(v) for v in expected(killed).values())
check(lost == total - sent_before, "the account says %d values were lost; metrics.jsonl has %d after step 10" %
      (lost, total - sent_before))
check((first, last) == (15, 30), "lost steps %d-%d, want 15-30" % (first, last))
check(m.group(6).split(", ")[:2] == ["config.toml", "metrics.jsonl"], "artifacts named: %s" % m.group(6))
# Started again on the same store: it holds exactly the values sent before the kill.
server = Server("server-again")
client = MlflowClient(server.uri)
want = expected(killed)
got = history(client, rid, want)
held = sum(len(v) for v in got.values())
check(held == sent_before, "the store holds %d values; %d were sent before the kill" % (held, sent_before))
check(all(same(sorted(v for v in want[k] if v[0] <= 10), got[k]) for k in want), "the store's values differ")
check(client.get_run(rid).info.status == "RUNNING", "the status changed without a server")
print("   restarted on the same store: %d values held + %d named lost = %d in metrics.jsonl" % (held, lost, total))
server.kill()

# --- 5. the server hangs mid-run (SIGSTOP) ----------------------------------------
# The end waits at most its promised 60 s for the hung server (a request in
# flight included), sends the run's status first, and tells apart what was
# never sent (the server must not have it) from what was sent but not
# answered (it may): after SIGCONT the store holds every value in between.
server = Server("server-hung")
client = MlflowClient(server.uri)
job, hung, rid = held_job("hung", server, client)
os.killpg(server.proc.pid, signal.SIGSTOP)
with open(gate, "w") as f:
    f.write("1000")
# The event "done": the last step's line is in metrics.jsonl.
while not any(s == 30 for s, _ in expected(hung).get("train/loss", [])):
    check(job.poll() is None or job.returncode == 0, "the job failed with the server hung")
    time.sleep(0.1)
done = time.time()
stdout, stderr = job.communicate(timeout=600)
ended = time.time() - done
check(job.returncode == 0, "training did not finish with the server hung (exit %d):\n%s" % (job.returncode, stderr))
print("5. server hung at step 10; the job exited %.1f s after its last step. Its warnings:\n   " % ended +
      "\n   ".join(stderr.strip().split("\n")))
# 60 s of flush; the plot and artifacts before it, and a loaded machine, get 15 s.
check(ended <= 75, "the job exited %.1f s after its last step; the promise is 60 s" % ended)
total = sum(len(v) for v in expected(hung).values())
not_sent = re.search(r"not sent to \S+: (\d+) metric value", stderr)
unanswered = re.search(r"but not answered \(the server may have stored them\): (\d+) metric value", stderr)
check(unanswered is not None, "the account does not name what was sent but not answered:\n" + stderr)
not_sent = int(not_sent.group(1)) if not_sent else 0
unanswered = int(unanswered.group(1))
check("the run's final status FINISHED" in stderr, "the account does not name the run's status:\n" + stderr)
os.killpg(server.proc.pid, signal.SIGCONT)
# The event: the woken server answers. Whatever it does with its backlog
# (uvicorn drops requests whose client has gone), acknowledged values are
# stored and values never sent are not.
deadline = time.time() + 300
while True:
    try:
        if urllib.request.urlopen(server.uri + "/health", timeout=5).status == 200:
            break
    except OSError:
        pass
    check(time.time() < deadline, "the woken server did not answer in 300 s")
    time.sleep(0.2)
got = history(client, rid, expected(hung))
held = sum(len(set(v)) for v in got.values())
check(total - not_sent - unanswered <= held <= total - not_sent,
      "the store holds %d values: %d in metrics.jsonl, %d named not sent, %d sent but not answered" %
      (held, total, not_sent, unanswered))
print("   woken: %d values held of %d (%d not sent, %d sent without an answer)" %
      (held, total, not_sent, unanswered))
server.kill()
print("oracle.mlflow_tracking: passed")
