#!/usr/bin/env python3
"""Training across slow links: Cohort's sync modes against PyTorch DDP on
emulated networks.

Puts N hosts (2, 4) in network namespaces joined by a bridge; every host's
link is shaped both ways with a token bucket (tc tbf) at the link's rate and
1 ms of netem delay per direction (2 ms host to host, one way; a kernel
without netem gets the rate limit alone, and the bench says so). Each host runs
one rank with one thread. On every link and host count it runs the same
bert-mini pretraining (GCIDE shards from `cohort prepare`, the same global
batch, constant learning rate, AdamW, clipping, bf16 autocast) with:

  exact        Cohort, dist.sync = step, gradients summed in fp32 as DDP sums
               them (dist.grad-compression = fp32; the default, none, sums
               in fp64 so that the step does not depend on the world size,
               at twice the traffic)
  bf16         Cohort, gradients in bf16 on the wire
  powersgd     Cohort, dist.grad-compression = powersgd at --rank
  local-H      Cohort, dist.sync = local with H inner steps per sync (8, 32);
               local-H-LR-M sets the outer step's lr and momentum; every
               rank is its own island (flat local steps)
  islands-H    Cohort, local steps of H between islands of a host's ranks
               (dist.islands = node: exact inside a host, each island rank
               sends 1/k of the change); suffixes: -fF streams it in F
               fragments, -dD lands each D steps after it is sent, -bf16 or
               -int8 its wire form between islands, -wW the gradients' wire
               inside an island (fp32, bf16, fp16; exact fp64 otherwise), -ef
               error feedback on the rounded change, as in
               islands-8-f4-d1-int8-ef-wbf16
  islands-powersgd  Cohort, PowerSGD at --rank between islands of a host's
               ranks (the exact sum inside a host, one compressed gradient
               per host between them)
  ddp          PyTorch DistributedDataParallel (bench/peers/bert_pretrain.py,
               the same network written out in PyTorch, MLM at the masked
               positions as Cohort computes it)
  ddp-powersgd the same with DDP's powerSGD_hook at --rank
  torchft-H    torchft 0.2.0's DiLoCo (the same peer, --diloco: every rank a
               replica group of one, a lighthouse in rank 0, Gloo; torchft has
               no exact sum inside an island, and its int8 path needs a GPU);
               suffixes: -fF strided fragments, -dD fragment delay, -aA alpha

and prints per method and link: steps per second, bytes on the wire per step
(host 0's interface counters, both directions, start-up and the final
checkpoint included), the same in steady state ("steady": between the first
logged step and the last one a whole number of sync windows later, before
the final step; evaluations in between count), the validation loss (the
first --eval-rows rows of the valid split) at fixed steps, and the training wall time to reach the
validation loss exact training reaches at step N = --target-step (evaluation
time excluded; linear between evaluations; "-" when not reached). Exact
methods run 1.25 N steps, the others 2 N.

Needs root (namespaces, tc); prints SKIPPED otherwise. `--check-link` only
sets up two hosts at 20 Mbit/s and checks that 5 MB take at least the time
the rate allows (ctest runs it as slow_link.shaping).

With --ranks-per-host k each host runs k ranks (one thread each) that talk
to each other inside the host, unshaped: 2 hosts x 2 ranks are 2 islands.

Usage: /opt/cohort/venv/bin/python3 bench/slow_link.py [--hosts 2,4] [--links 100mbit,1gbit]
           [--methods exact,bf16,powersgd,local-8,local-32,ddp,ddp-powersgd] [--target-step 80]
           [--ranks-per-host 1] [--eval-every 10] [--eval-rows 256] [--seed S] [--data data/gcide] [--build build]
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable


def sh(cmd, check=True):
    return subprocess.run(cmd, shell=True, check=check, capture_output=True, text=True)


class Hosts:
    """n namespaces cslH<tag>n<i> at 10.<subnet>.0.(i+1)/24 on a bridge in
    cslS<tag>; each veth pair shaped both ways to `rate` with `delay`."""

    def __init__(self, n, rate, subnet=87, delay="1ms"):
        self.tag = str(os.getpid() % 100000)
        self.n, self.subnet = n, subnet
        self.sw = "cslS" + self.tag
        self.names = [self.sw] + [self.host(i) for i in range(n)]
        cmds = ["ip netns add %s" % self.sw, "ip -n %s link add br0 type bridge" % self.sw,
                "ip -n %s link set br0 up" % self.sw]
        for i in range(n):
            h, a, b = self.host(i), self.dev(i), "cs%si%d" % (self.tag, i)
            cmds += ["ip netns add %s" % h, "ip link add %s type veth peer name %s" % (a, b),
                     "ip link set %s netns %s" % (a, h), "ip link set %s netns %s" % (b, self.sw),
                     "ip -n %s link set %s master br0" % (self.sw, b), "ip -n %s link set %s up" % (self.sw, b),
                     "ip -n %s addr add %s/24 dev %s" % (h, self.address(i), a), "ip -n %s link set %s up" % (h, a),
                     "ip -n %s link set lo up" % h]
            for ns, dev in ((h, a), (self.sw, b)):  # both directions
                if NETEM:
                    cmds += ["ip netns exec %s tc qdisc add dev %s root handle 1: netem delay %s limit 100000"
                             % (ns, dev, delay),
                             "ip netns exec %s tc qdisc add dev %s parent 1: handle 2: tbf rate %s burst %s latency "
                             "100ms" % (ns, dev, rate, burst(rate))]
                else:
                    cmds += ["ip netns exec %s tc qdisc add dev %s root tbf rate %s burst %s latency 100ms"
                             % (ns, dev, rate, burst(rate))]
        try:
            for c in cmds:
                sh(c)
        except subprocess.CalledProcessError as e:
            self.close()
            raise SystemExit("slow_link: %s failed: %s" % (e.cmd, e.stderr.strip()))

    def host(self, i):
        return "cslH%sn%d" % (self.tag, i)

    def dev(self, i):
        return "ch%si%d" % (self.tag, i)

    def address(self, i):
        return "10.%d.0.%d" % (self.subnet, i + 1)

    def on(self, i, cmd):
        return ["ip", "netns", "exec", self.host(i)] + cmd

    def bytes(self, i):
        """Bytes host i's link carried so far, both directions."""
        out = sh("ip netns exec %s cat /sys/class/net/%s/statistics/tx_bytes /sys/class/net/%s/statistics/rx_bytes"
                 % (self.host(i), self.dev(i), self.dev(i))).stdout.split()
        return sum(int(x) for x in out)

    def close(self):
        for name in self.names:
            sh("ip netns del %s" % name, check=False)


def netem_available():
    """Whether this kernel has netem (some ship tbf without it)."""
    ns = "cslProbe%d" % os.getpid()
    try:
        sh("ip netns add %s && ip -n %s link add pa type veth peer name pb" % (ns, ns))
        return sh("ip netns exec %s tc qdisc add dev pa root netem delay 1ms" % ns, check=False).returncode == 0
    finally:
        sh("ip netns del %s" % ns, check=False)


NETEM = None  # set in main()


def burst(rate):
    """tbf's bucket: at least 10 ms of the rate (and an MTU)."""
    bits = float(rate.lower().replace("gbit", "e9").replace("mbit", "e6"))
    return "%dkb" % max(32, int(bits / 8 * 0.01 / 1024))


def check_link():
    """Two hosts at 20 Mbit/s: 5 MB over TCP cannot take less than 2 s."""
    hosts = Hosts(2, "20mbit", subnet=86)
    try:
        server = subprocess.Popen(hosts.on(1, [PYTHON, "-c", (
            "import socket\ns=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            "s.bind(('%s', 29555)); s.listen(1); print('ready', flush=True)\nc,_=s.accept(); n=0\n"
            "while True:\n    b=c.recv(1<<16)\n    if not b: break\n    n+=len(b)\nprint(n, flush=True)")
            % hosts.address(1)]), stdout=subprocess.PIPE, text=True)
        assert server.stdout.readline().strip() == "ready"
        size = 5 * 1000 * 1000
        t0 = time.monotonic()
        sh("ip netns exec %s %s -c \"import socket; s=socket.create_connection(('%s', 29555)); "
           "s.sendall(bytes(%d)); s.close()\"" % (hosts.host(0), PYTHON, hosts.address(1), size))
        got = int(server.stdout.readline())
        server.wait()
        elapsed = time.monotonic() - t0
        floor = size * 8 / 20e6
        print("slow_link: %d bytes in %.2f s over a 20 Mbit/s link (the rate allows no less than %.2f s)"
              % (got, elapsed, floor))
        ok = got == size and elapsed >= 0.95 * floor
        print("slow_link: link shaping %s" % ("works" if ok else "FAILED"))
        return 0 if ok else 1
    finally:
        hosts.close()


def prepare_data(build, data):
    if os.path.exists(os.path.join(data, "manifest.json")):
        return
    print("slow_link: preparing GCIDE into %s" % data, flush=True)
    subprocess.run([os.path.join(build, "cohort"), "prepare", "--input", "/usr/share/dictd/gcide.dict.dz", "--out",
                    data, "--overwrite", "--vocab-size", "8192", "--max-seq-length", "128", "--max-predictions", "20",
                    "--dupe-factor", "1"], check=True)


COMMON = {"hidden": 256, "layers": 4, "heads": 4, "lr": 1e-3}


def cohort_cmd(args, method, hosts, i, out, steps):
    cmd = [os.path.join(args.build, "cohort"), "train", "--train.task", "bert-pretrain", "--model.name", "bert",
           "--model.hidden", str(COMMON["hidden"]), "--model.layers", str(COMMON["layers"]), "--model.heads",
           str(COMMON["heads"]), "--model.intermediate", str(4 * COMMON["hidden"]), "--model.max-positions", "512",
           "--data.path", args.data, "--data.global-batch", str(args.batch), "--data.workers", "1",
           "--optim.lr", str(COMMON["lr"]), "--optim.eps", "1e-6", "--optim.schedule", "constant",
           "--optim.clip-norm", "1.0", "--train.precision", "bf16", "--train.max-steps", str(steps),
           "--train.threads", "1", "--eval.split", "valid", "--eval.every-steps", str(args.eval_every),
           "--eval.max-samples", str(args.eval_rows), "--eval.batch", "64", "--log.every-steps", str(args.eval_every),
           "--ckpt.every-steps", "0", "--dist.timeout", "600", "--out", out, "--overwrite",
           "--init-method", "tcp://%s:29650" % hosts.address(0), "--nnodes", str(hosts.n), "--node-rank", str(i),
           "--nproc-per-node", str(args.ranks_per_host)]
    if args.seed is not None:
        cmd += ["--train.seed", str(args.seed)]
    if method == "exact":
        cmd += ["--dist.grad-compression", "fp32"]
    elif method == "bf16":
        cmd += ["--dist.grad-compression", "bf16"]
    elif method == "powersgd":
        cmd += ["--dist.grad-compression", "powersgd", "--dist.powersgd-rank", str(args.rank)]
    elif method.startswith("local-"):  # local-H, or local-H-LR-MOMENTUM for the outer step
        parts = method.split("-")
        cmd += ["--dist.sync", "local", "--dist.local-steps", parts[1], "--dist.islands", "rank"]
        if len(parts) == 4:
            cmd += ["--optim.outer-lr", parts[2], "--optim.outer-momentum", parts[3]]
    elif method == "islands-powersgd":
        cmd += ["--dist.grad-compression", "powersgd", "--dist.powersgd-rank", str(args.rank), "--dist.islands", "node"]
    elif method.startswith("islands-"):  # islands-H[-fF][-dD][-bf16|-int8]
        parts = method.split("-")
        cmd += ["--dist.sync", "local", "--dist.local-steps", parts[1], "--dist.islands", "node"]
        for p in parts[2:]:
            if p.startswith("f"):
                cmd += ["--dist.outer-fragments", p[1:]]
            elif p.startswith("d"):
                cmd += ["--dist.outer-delay", p[1:]]
            elif p.startswith("w"):
                cmd += ["--dist.island-compression", p[1:]]
            elif p == "ef":
                cmd += ["--dist.outer-error-feedback"]
            else:
                cmd += ["--dist.grad-compression", p]
    return cmd


def dealt_ids(args, n, work):
    """Cohort's dealing of the global order to n ranks for 2 N steps, from a
    run of a tiny model with log.sample-ids (the order does not depend on
    the model): the DDP peer reads the same rows at every step."""
    out = os.path.join(work, "ids")
    steps = 2 * args.target_step
    subprocess.run([os.path.join(args.build, "cohort"), "train", "--train.task", "bert-pretrain", "--model.name",
                    "bert", "--model.hidden", "16", "--model.layers", "1", "--model.heads", "1",
                    "--model.intermediate", "16", "--model.max-positions", "512", "--data.path", args.data,
                    "--data.global-batch", str(args.batch), "--train.max-steps", str(steps), "--log.sample-ids",
                    "--eval.max-samples", "64", "--nproc-per-node", str(n), "--oversubscribe", "--quiet",
                    "--out", out, "--overwrite"], check=True)
    per_step = [[None] * n for _ in range(steps)]
    for r in range(n):
        for line in open(os.path.join(out, "sample-ids", "rank-%d.jsonl" % r)):
            j = json.loads(line)
            per_step[j["step"] - 1][r] = j["ids"]
    path = os.path.join(work, "ids.json")
    json.dump({"steps": per_step}, open(path, "w"))
    return path


def peer_cmd(args, method, hosts, i, steps):
    """Global rank i of hosts.n * ranks_per_host, on host i // ranks_per_host."""
    ranks = hosts.n * args.ranks_per_host
    # Gloo would pick the address the hostname resolves to (loopback here).
    return ["env", "GLOO_SOCKET_IFNAME=" + hosts.dev(i // args.ranks_per_host), PYTHON,
            os.path.join(ROOT, "bench", "peers", "bert_pretrain.py"), "--model", "mirror", "--mlm", "masked",
            "--vocab", "8192", "--hidden", str(COMMON["hidden"]), "--layers", str(COMMON["layers"]), "--heads",
            str(COMMON["heads"]), "--batch", str(args.batch // ranks), "--steps", str(steps), "--threads", "1",
            "--precision", "bf16", "--data", args.data, "--lr", str(COMMON["lr"]), "--rank", str(i), "--ranks",
            str(ranks), "--master", "%s:29651" % hosts.address(0), "--eval-every", str(args.eval_every),
            "--eval-rows", str(args.eval_rows), "--hook", "powersgd" if method == "ddp-powersgd" else "none",
            "--powersgd-rank", str(args.rank), "--ids", args.ids] + diloco_args(method)


def diloco_args(method):
    """torchft-H[-fF][-dD][-aA]: the peer's DiLoCo flags; [] for DDP."""
    if not method.startswith("torchft-"):
        return []
    parts = method.split("-")
    out = ["--diloco", "--sync-every", parts[1]]
    flags = {"f": "--fragments", "d": "--fragment-delay", "a": "--alpha"}
    for p in parts[2:]:
        out += [flags[p[0]], p[1:]]
    return out


def cohort_curve(run_dir):
    """(step, training seconds so far, eval loss) per evaluation."""
    train_s, last_step, curve = 0.0, 0, []
    for line in open(os.path.join(run_dir, "metrics.jsonl")):
        j = json.loads(line)
        if j["kind"] == "train":
            train_s += j["phase_ms"]["step"] / 1e3 * (j["step"] - last_step)
            last_step = j["step"]
        elif j["kind"] == "eval":
            curve.append((j["step"], train_s, j["loss"]))
    return curve


def logged_lines(proc, path):
    """Lines of `path` as the process appends them (Cohort's metrics.jsonl),
    or of its stdout when path is None (the peer's), until it exits."""
    if path is None:
        yield from proc.stdout
        return
    pos, buf = 0, ""
    while True:
        done = proc.poll() is not None
        if os.path.exists(path):
            with open(path) as f:
                f.seek(pos)
                buf += f.read()
                pos = f.tell()
            *complete, buf = buf.split("\n")
            yield from complete
        if done:
            return
        time.sleep(0.05)


def steady_wire(marks, period, last_step):
    """Bytes per step on host 0's link between two logged steps, past
    start-up and before the final step's sync and checkpoint: from the first
    mark to the furthest one a whole number of `period`s (the sync window)
    later. None when no two marks fit."""
    marks = [(s, b) for s, b in marks if s < last_step]
    if len(marks) < 2:
        return None
    a, a_bytes = marks[0]
    spans = [(s, b) for s, b in marks[1:] if (s - a) % period == 0]
    if not spans:
        return None
    s, b = spans[-1]
    return (b - a_bytes) / (s - a)


def sync_period(method):
    """Steps between the syncs of one fragment (1 for every-step methods)."""
    parts = method.split("-")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 1


def run_method(args, method, hosts, work):
    out = os.path.join(work, method)
    steps = steps_for(args, method)
    metrics = None if method.startswith(("ddp", "torchft")) else os.path.join(out + "-node0", "metrics.jsonl")
    if metrics and os.path.exists(metrics):
        os.remove(metrics)  # a previous run's: the marks below read the new one as it grows
    before = hosts.bytes(0)
    procs = []
    # Cohort: one launcher per host; the PyTorch peer: one process per rank.
    peer = method.startswith(("ddp", "torchft"))
    for i in range(hosts.n * args.ranks_per_host if peer else hosts.n):
        host = i // args.ranks_per_host if peer else i
        cmd = peer_cmd(args, method, hosts, i, steps) if peer else \
            cohort_cmd(args, method, hosts, i, out + "-node%d" % i, steps)
        log = open(os.path.join(work, "%s.%d.log" % (method, i)), "w")
        procs.append((subprocess.Popen(hosts.on(host, cmd), stdout=subprocess.PIPE if i == 0 and peer else log,
                                       stderr=log, text=True), log))
    # Host 0's counter as each step is logged (the peer's evaluations,
    # Cohort's metrics lines), for the steady-state bytes per step.
    lines, marks = [], []
    for line in logged_lines(procs[0][0], metrics):
        lines.append(line)
        try:
            j = json.loads(line)
        except ValueError:
            continue
        if isinstance(j, dict) and "step" in j and (peer or j.get("kind") == "train"):
            marks.append((j["step"], hosts.bytes(0)))
    for p, log in procs:
        p.wait()
        log.close()
        if p.returncode != 0:
            raise SystemExit("slow_link: %s failed on a host (exit %d): see %s" % (method, p.returncode, work))
    after = hosts.bytes(0)
    wire = (after - before) / steps
    if marks:  # where the rest went: before the first logged step, and after the last
        print("  %s: %.1f MB on host 0's link until step %d, %.1f MB after step %d (of %d)"
              % (method, (marks[0][1] - before) / 1e6, marks[0][0], (after - marks[-1][1]) / 1e6, marks[-1][0], steps),
              flush=True)
    if peer:
        curve = [(j["step"], j["train_s"], j["loss"]) for j in map(json.loads, lines) if "train_s" in j]
    else:
        curve = cohort_curve(out + "-node0")
    return {"method": method, "curve": curve, "wire_per_step": wire,
            "steady_wire": steady_wire(marks, sync_period(method), steps)}


def time_to(curve, target):
    """Training seconds until the eval loss first reaches `target`, linear
    between the evaluations around it; None when it never does."""
    prev = (0.0, float("inf"))
    for step, seconds, loss in curve:
        if loss <= target:
            t0, l0 = prev
            if l0 == float("inf") or l0 == loss:
                return seconds
            return t0 + (seconds - t0) * (l0 - target) / (l0 - loss)
        prev = (seconds, loss)
    return None


def steps_for(args, method):
    """Exact methods run a quarter past the target step; compressed and
    local ones twice as far, to show when they get there."""
    exact = method in ("exact", "bf16", "ddp")  # islands-1 is exact too, but slower per step
    return int(args.target_step * (1.25 if exact else 2))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", default="2,4")
    ap.add_argument("--links", default="100mbit,1gbit")
    ap.add_argument("--methods", default="exact,bf16,powersgd,local-8,local-32,ddp,ddp-powersgd")
    ap.add_argument("--target-step", type=int, default=80, help="N: exact methods run 1.25 N steps, the others 2 N")
    ap.add_argument("--ranks-per-host", type=int, default=1, help="ranks on each host, joined unshaped")
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--target-loss", type=float, default=0.0, help="instead of exact's at step N (a partial rerun)")
    ap.add_argument("--eval-rows", type=int, default=256)
    ap.add_argument("--seed", type=int, default=None, help="Cohort's train.seed (model, masks, order); the peers "
                    "keep theirs")
    ap.add_argument("--batch", type=int, default=32, help="global batch")
    ap.add_argument("--rank", type=int, default=4, help="PowerSGD's rank (Cohort and DDP)")
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "gcide"))
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--work", default="/tmp/cohort-slow-link")
    ap.add_argument("--check-link", action="store_true")
    args = ap.parse_args()
    skipped = 77 if args.check_link else 0  # ctest's SKIP_RETURN_CODE
    if os.geteuid() != 0:
        print("SKIPPED: network namespaces and tc need root")
        return skipped
    if sh("ip -V", check=False).returncode != 0 or sh("tc -V", check=False).returncode != 0:
        print("SKIPPED: iproute2 (ip, tc) is not installed")
        return skipped
    global NETEM
    NETEM = netem_available()
    if not NETEM:
        print("slow_link: this kernel has no netem qdisc: links are rate-limited (tbf) without added latency")
    if args.check_link:
        return check_link()
    prepare_data(args.build, args.data)
    methods = args.methods.split(",")
    print("slow_link: bert-mini (H=%d, L=%d), global batch %d, eval every %d steps on %d valid rows; target: exact's "
          "eval loss at step %d" % (COMMON["hidden"], COMMON["layers"], args.batch, args.eval_every, args.eval_rows,
                                    args.target_step), flush=True)
    for n in map(int, args.hosts.split(",")):
        shape = "%dhosts" % n if args.ranks_per_host == 1 else "%dx%d" % (n, args.ranks_per_host)
        dealt = os.path.join(args.work, shape)
        os.makedirs(dealt, exist_ok=True)
        args.ids = dealt_ids(args, n * args.ranks_per_host, dealt)  # the same on every link
        for link in args.links.split(","):
            work = os.path.join(args.work, "%s-%s" % (shape, link))
            os.makedirs(work, exist_ok=True)
            hosts = Hosts(n, link)
            try:
                results = []
                for m in methods:
                    results.append(run_method(args, m, hosts, work))
                    r = results[-1]
                    print("  %d hosts %s %-13s done: eval %s" % (n, link, m, ", ".join(
                        "%d:%.3f" % (s, l) for s, _, l in r["curve"])), flush=True)
            finally:
                hosts.close()
            exact = next((r for r in results if r["method"] == "exact"), None)
            target = args.target_loss or next(l for s, _, l in exact["curve"] if s >= args.target_step)
            ddp = next((r for r in results if r["method"] == "ddp"), None)
            ddp_t = time_to(ddp["curve"], target) if ddp else None
            print("\n%d hosts x %d rank(s), %s (tbf both ways%s); target eval loss %.4f (exact at step %d)"
                  % (n, args.ranks_per_host, link, ", 2 ms one way" if NETEM else ", no added latency", target,
                     args.target_step))
            half, n_ = args.target_step // 2, args.target_step
            print("| method | steps/s | MB on the wire/step | steady MB/step | eval loss @%d | @%d | @%d | time to target "
                  "| vs ddp |" % (half, n_, 2 * n_))
            print("|---|---|---|---|---|---|---|---|---|")
            for r in results:
                curve = r["curve"]
                total_s = curve[-1][1]
                at = lambda k: next(("%.4f" % l for s, _, l in curve if s >= k), "-")
                t = time_to(curve, target)
                steady = r["steady_wire"]
                print("| %s | %.2f | %.2f | %s | %s | %s | %s | %s | %s |" % (
                    r["method"], curve[-1][0] / total_s, r["wire_per_step"] / 1e6,
                    "%.2f" % (steady / 1e6) if steady is not None else "-", at(half), at(n_), at(2 * n_),
                    "%.0f s" % t if t else "-", "%.2fx" % (ddp_t / t) if t and ddp_t else "-"), flush=True)
            print(flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
