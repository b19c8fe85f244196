#!/usr/bin/env python3
"""Elastic recovery: from the loss of a host to the first step of the new world.

Three hosts, each a network namespace of its own joined by a bridge (root and
iproute2 needed), train a tiny MLP with --nnodes 3 --min-nodes 2. At step 10
host 2 is lost in one of three ways, interleaved over --reps rounds:

  kill     its launcher is killed (SIGKILL; its worker dies with it)
  stall    its worker is stopped (SIGSTOP): alive, silent
  vanish   its link goes down: no RST, no FIN, the host is just gone

The figure is the wall time from the loss to the first step the two
survivors complete together (metrics.jsonl's membership record), and the
formation's share of it. The target is dist.timeout plus under 5 s.

Usage: sudo python3 bench/elastic_recovery.py [--bin build/cohort] [--reps 3]
"""
import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

TAG = str(os.getpid() % 100000)
SWITCH = f"cohortBS{TAG}"


def host(i):
    return f"cohortBH{TAG}n{i}"


def sh(cmd):
    subprocess.run(cmd, shell=True, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def make_hosts(n):
    sh(f"ip netns add {SWITCH} && ip -n {SWITCH} link add br0 type bridge && ip -n {SWITCH} link set br0 up")
    for i in range(n):
        a, b = f"bh{TAG}i{i}", f"bs{TAG}i{i}"
        sh(f"ip netns add {host(i)} && ip link add {a} type veth peer name {b} && ip link set {a} netns {host(i)} && "
           f"ip link set {b} netns {SWITCH} && ip -n {SWITCH} link set {b} master br0 && ip -n {SWITCH} link set {b} up && "
           f"ip -n {host(i)} addr add 10.234.0.{i + 1}/24 dev {a} && ip -n {host(i)} link set {a} up && "
           f"ip -n {host(i)} link set lo up")


def remove_hosts(n):
    for name in [host(i) for i in range(n)] + [SWITCH]:
        subprocess.run(f"ip netns del {name}", shell=True, stderr=subprocess.DEVNULL)


def write_dataset(d, n=240):
    def idx(dims, elems, mod):
        return bytes([0, 0, 8, len(dims)]) + b"".join(struct.pack(">I", x) for x in dims) + bytes(i % mod for i in range(elems))
    for p in ("train", "t10k"):
        open(f"{d}/{p}-images-idx3-ubyte", "wb").write(idx([n, 8, 8], 64 * n, 251))
        open(f"{d}/{p}-labels-idx1-ubyte", "wb").write(idx([n], n, 4))


def records(metrics, kind):
    out = []
    try:
        for line in open(metrics):
            try:
                j = json.loads(line)
            except ValueError:
                continue
            if j.get("kind") == kind:
                out.append(j)
    except FileNotFoundError:
        pass
    return out


def one_round(binary, data, how, port, timeout):
    run = tempfile.mkdtemp(prefix="cohort-elastic-")
    args = (f"train --model.name mlp --model.dropout 0 --data.global-batch 12 --train.epochs 6 --log.every-steps 1 "
            f"--dist.timeout {timeout} --init-method tcp://10.234.0.1:{port} --nnodes 3 --min-nodes 2 --quiet "
            f"--data.path {data} --out {run}/run").split()
    procs = []
    for i in range(3):
        env = dict(os.environ, COHORT_DEBUG_DELAY="0:60")
        procs.append(subprocess.Popen(["ip", "netns", "exec", host(i), binary] + args + ["--node-rank", str(i)],
                                      env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    metrics = f"{run}/run/metrics.jsonl"
    while not any(r["step"] >= 10 for r in records(metrics, "train")):
        time.sleep(0.02)
        if procs[0].poll() is not None:
            raise SystemExit(f"node 0 exited early ({procs[0].returncode}); see {run}")
    lost_at = time.time()
    if how == "kill":
        procs[2].kill()
    elif how == "stall":
        worker = open(f"/proc/{procs[2].pid}/task/{procs[2].pid}/children").read().split()[0]
        os.kill(int(worker), 19)  # SIGSTOP
    else:
        sh(f"ip -n {host(2)} link set bh{TAG}i2 down")
    for p in procs[:2]:
        p.wait(timeout=300)
    procs[2].kill()
    subprocess.run(f"pkill -KILL -f 'out {run}/run'", shell=True)
    if how == "vanish":
        sh(f"ip -n {host(2)} link set bh{TAG}i2 up")
    change = records(metrics, "membership")
    if len(change) != 1 or procs[0].returncode != 0:
        raise SystemExit(f"{how}: expected one membership change and a clean finish; see {run}")
    c = change[0]
    subprocess.run(["rm", "-rf", run])
    return c["unix_ms"] / 1000.0 - lost_at, c["formed_s"], c["recovery_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/cohort")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=30, help="dist.timeout (s)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("SKIPPED: network namespaces need root")
        return 0
    binary = os.path.abspath(a.bin)
    data = tempfile.mkdtemp(prefix="cohort-elastic-data-")
    write_dataset(data)
    make_hosts(3)
    results = {"kill": [], "stall": [], "vanish": []}
    try:
        port = 29700
        for rep in range(a.reps):
            for how in results:
                port += 1
                r = one_round(binary, data, how, port, a.timeout)
                results[how].append(r)
                print(f"round {rep + 1} {how:6s}: loss -> first step {r[0]:.2f} s (formation {r[1]:.2f} s)",
                      flush=True)
    finally:
        remove_hosts(3)
    print(f"\nmedians over {a.reps} rounds, dist.timeout {a.timeout:g} s, heartbeat 1 s:")
    print("| host lost by | loss -> first step of the new world | of which forming the world |")
    print("|---|---|---|")
    for how, rs in results.items():
        print(f"| {how} | {statistics.median(r[0] for r in rs):.2f} s | {statistics.median(r[1] for r in rs):.2f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
