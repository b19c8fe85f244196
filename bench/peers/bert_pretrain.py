#!/usr/bin/env python3
"""PyTorch peer for Cohort's BERT benchmarks: BERT pretraining (MLM + NSP) in
PyTorch eager, single process or DDP over gloo, on the torch of Cohort's
environment (run it with /opt/cohort/venv/bin/python3).

--model hf (the default) is Hugging Face's transformers.BertForPreTraining as
users run it: its loss from labels, the MLM decoder over every position.
--model mirror is the same network written out here, with --mlm masked
running the decoder only at the masked positions, as Cohort does (--mlm all:
every position, like HF).

Batches: --data DIR reads rows of DIR/train/*.hdf5 (shards from `cohort
prepare`, NVIDIA's layout) as --ids deals them (Cohort's global order,
from a run's log.sample-ids), or else in order, rank r of R taking rows r*B.. of each
block of R*B, trimmed to the longest row exactly as Cohort's reader trims,
so bench/bert_vs_pytorch.py --data gives both sides the same batches.
Without --data, batches are synthetic: every row full length with P
predictions. AdamW, clipping, one optimizer step per batch. Prints one JSON
line: {"ranks": R, "step_ms": ..., "tokens_per_s": ..., "samples_per_s": ...}
where tokens are real (non-padding) tokens.

One rank per process, started by someone else (bench/slow_link.py starts
one in each network namespace): --rank R --ranks N --master ADDR:PORT. Then
--hook powersgd [--powersgd-rank r] registers DDP's powerSGD_hook (from the
second step: start_powerSGD_iter 2, the least PyTorch accepts; with one
gradient bucket, the only way it runs on Gloo, see worker()), and
--optimizer zero takes PyTorch's ZeroRedundancyOptimizer over AdamW, and
--report-memory has every rank print {"rank": r, "peak_rss_mb": ...}
(bench/shard_memory.py). --eval-every K --eval-rows E scores the first E rows of DIR/valid every K
steps (the same sums Cohort's eval loss is: MLM loss per prediction plus NSP
loss per sample) and prints a JSON line per evaluation:
{"step": S, "train_s": seconds of training so far, "loss": ...}.

--diloco trains with torchft's DiLoCo instead of DDP (pip install torchft==0.2.0):
each rank is a replica group of one process (replica_id "replica<R>", its
own TCPStore at --store-port + R), the inner optimizer AdamW on its own
batches, and every --sync-every H steps the pseudo-gradient (the change
since the last sync) averaged over torchft's ProcessGroupGloo and applied by
an outer SGD (--outer-lr, --outer-momentum: Nesterov when > 0). --fragments F
> 1 is Streaming DiLoCo: F strided groups of the encoder layers (fragment i:
layers i, i+F, ...; the embeddings and heads go with fragment 0), one synced
every H/F steps, each sent --fragment-delay D steps before it is applied and
merged with the local weights by --alpha (torchft's fragment_update_alpha).
Rank 0 runs the lighthouse on --lighthouse-port (default --master's port +
1) unless --lighthouse gives one; Gloo takes its interface from
GLOO_SOCKET_IFNAME, and the stores and managers advertise that interface's
address (else the address that reaches --master). Each rank prints
{"rank": R, "diloco_syncs": ..., "commit_failures": ...} to stderr at the end.

Usage: bench/peers/bert_pretrain.py --hidden 256 --layers 4 --heads 4 --seq 128 \
           --batch 16 --precision bf16 --threads 2 [--ranks 2] [--data DIR] [--model hf|mirror]
       bench/peers/bert_pretrain.py --model mirror --mlm masked --rank R --ranks N --master 10.1.0.1:29500 \
           --data DIR --hook powersgd --eval-every 20 --eval-rows 512 --steps 200
       bench/peers/bert_pretrain.py --model mirror --mlm masked --rank R --ranks N --master 10.1.0.1:29500 \
           --data DIR --diloco --sync-every 8 [--fragments 2 --fragment-delay 1 --alpha 0.5] --steps 200
"""
import argparse
import glob
import json
import math
import os
import socket
import sys
import time
from datetime import timedelta

import numpy as np

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


class Layer(nn.Module):
    def __init__(self, h, a, i, p):
        super().__init__()
        self.a, self.d = a, h // a
        self.qkv = nn.ModuleList([nn.Linear(h, h) for _ in range(3)])
        self.attn_out, self.ln1 = nn.Linear(h, h), nn.LayerNorm(h, eps=1e-12)
        self.inter, self.out, self.ln2 = nn.Linear(h, i), nn.Linear(i, h), nn.LayerNorm(h, eps=1e-12)
        self.drop = nn.Dropout(p)

    def forward(self, x, bias):
        b, l, h = x.shape
        q, k, v = (m(x).view(b, l, self.a, self.d).transpose(1, 2) for m in self.qkv)
        probs = self.drop(torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.d) + bias, -1))
        ctx = (probs.to(v.dtype) @ v).transpose(1, 2).reshape(b, l, h)
        a = self.ln1(self.drop(self.attn_out(ctx)) + x)
        return self.ln2(self.drop(self.out(F.gelu(self.inter(a)))) + a)


class Bert(nn.Module):
    def __init__(self, v, h, layers, a, i, maxpos, p):
        super().__init__()
        self.word, self.pos, self.typ = nn.Embedding(v, h), nn.Embedding(maxpos, h), nn.Embedding(2, h)
        self.ln, self.drop = nn.LayerNorm(h, eps=1e-12), nn.Dropout(p)
        self.layers = nn.ModuleList([Layer(h, a, i, p) for _ in range(layers)])
        self.pool, self.nsp = nn.Linear(h, h), nn.Linear(h, 2)
        self.tr, self.tr_ln = nn.Linear(h, h), nn.LayerNorm(h, eps=1e-12)
        self.bias = nn.Parameter(torch.zeros(v))
        # BERT's initialisation (as Cohort and HF use): N(0, 0.02) weights,
        # zero biases, unit LayerNorm. PyTorch's defaults (N(0,1) embeddings)
        # drive the softmax into denormals, which run ~8x slower on CPU.
        for name, t in self.named_parameters():
            with torch.no_grad():
                if t.dim() >= 2:
                    t.normal_(0.0, 0.02)
                elif "ln" in name and name.endswith("weight"):
                    t.fill_(1.0)
                else:
                    t.zero_()

    def forward(self, ids, seg, mask, positions, labels, nsp_labels, masked_only):
        labels = torch.where(labels >= 0, labels, -100)  # -1: no prediction (shards' padding)
        x = self.word(ids) + self.pos(torch.arange(ids.shape[1]))[None] + self.typ(seg)
        x = self.drop(self.ln(x))
        bias = ((1.0 - mask.float()) * -10000.0)[:, None, None, :]
        for layer in self.layers:
            x = layer(x, bias)
        nsp = self.nsp(torch.tanh(self.pool(x[:, 0])))
        if masked_only:
            rows = x.gather(1, positions[..., None].expand(-1, -1, x.shape[-1])).reshape(-1, x.shape[-1])
            target = labels.reshape(-1)
        else:  # HF: logits at every position, loss where labels != -100
            rows = x.reshape(-1, x.shape[-1])
            target = torch.full(ids.shape, -100, dtype=torch.long)
            target.scatter_(1, positions, labels)
            target = target.reshape(-1)
        # LayerNorm in fp32, as Cohort and CUDA autocast run it.
        # The tied decoder as Hugging Face applies it (an nn.Linear sharing the
        # embedding's weight): F.linear, not `@ weight.t()`, whose backward
        # OpenBLAS runs ~15x slower here.
        logits = F.linear(self.tr_ln(F.gelu(self.tr(rows)).float()), self.word.weight, self.bias)
        return F.cross_entropy(logits.float(), target, ignore_index=-100) + F.cross_entropy(nsp.float(), nsp_labels)

    def losses(self, ids, seg, mask, positions, labels, nsp_labels):
        """Summed MLM loss, summed NSP loss and the prediction count (evaluation)."""
        labels = torch.where(labels >= 0, labels, -100)
        x = self.word(ids) + self.pos(torch.arange(ids.shape[1]))[None] + self.typ(seg)
        x = self.ln(x)
        bias = ((1.0 - mask.float()) * -10000.0)[:, None, None, :]
        for layer in self.layers:
            x = layer(x, bias)
        nsp = self.nsp(torch.tanh(self.pool(x[:, 0])))
        rows = x.gather(1, positions[..., None].expand(-1, -1, x.shape[-1])).reshape(-1, x.shape[-1])
        target = labels.reshape(-1)
        logits = F.linear(self.tr_ln(F.gelu(self.tr(rows)).float()), self.word.weight, self.bias)
        mlm = F.cross_entropy(logits.float(), target, ignore_index=-100, reduction="sum")
        return mlm.item(), F.cross_entropy(nsp.float(), nsp_labels, reduction="sum").item(), float((target >= 0).sum())


def synthetic_batches(args, rank):
    g = torch.Generator().manual_seed(rank)
    b, s, p = args.batch, args.seq, args.predictions
    ids = torch.randint(5, args.vocab, (b, s), generator=g)
    seg = torch.zeros(b, s, dtype=torch.long)
    seg[:, s // 2:] = 1
    mask = torch.ones(b, s, dtype=torch.long)
    positions = torch.stack([torch.randperm(s - 1, generator=g)[:p] + 1 for _ in range(b)]).sort(1).values
    labels = torch.randint(5, args.vocab, (b, p), generator=g)
    nsp_labels = torch.randint(0, 2, (b,), generator=g)
    while True:
        yield ids, seg, mask, positions, labels, nsp_labels


def shard_batches(args, rank):
    """Rows of DIR/train in order, this rank's slice of each block of
    ranks * batch rows, trimmed as Cohort's BertShards::get_batch trims."""
    import h5py
    keys = ("input_ids", "segment_ids", "input_mask", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels")
    shards = sorted(glob.glob(os.path.join(args.data, "train", "*.hdf5")))
    assert shards, "no shards in %s/train" % args.data
    files = [h5py.File(p, "r") for p in shards]
    sizes = [f["input_ids"].shape[0] for f in files]
    starts = np.cumsum([0] + sizes)
    total, b = int(starts[-1]), args.batch
    dealt = json.load(open(args.ids))["steps"] if args.ids else None
    block = 0
    while True:
        if dealt:  # this rank's ids of the step, as Cohort dealt them
            ids = dealt[block % len(dealt)][rank]
        else:
            first = (block * args.ranks * b + rank * b) % (total - b)
            ids = range(first, first + b)
        block += 1
        rows = {k: [] for k in keys}
        for g in ids:
            s = int(np.searchsorted(starts, g, side="right") - 1)
            for k in keys:
                rows[k].append(np.asarray(files[s][k][g - starts[s]], dtype=np.int64))
        d = {k: torch.from_numpy(np.stack(v)) for k, v in rows.items()}
        pos, mid = d["masked_lm_positions"], d["masked_lm_ids"]
        real = torch.cumprod((pos != 0).long(), 1).bool()  # NVIDIA: the first 0 ends the predictions
        pos, mid = torch.where(real, pos, 0), torch.where(real, mid, -1)
        width = int(max(d["input_mask"].sum(1).max(), (pos.max() + 1) if real.any() else 0))
        yield (d["input_ids"][:, :width], d["segment_ids"][:, :width], d["input_mask"][:, :width], pos, mid,
               d["next_sentence_labels"])


def hf_model(args):
    from transformers import BertConfig, BertForPreTraining
    config = BertConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                        num_attention_heads=args.heads, intermediate_size=args.intermediate or 4 * args.hidden,
                        max_position_embeddings=512, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    return BertForPreTraining(config)  # BERT's init: N(0, 0.02), zero biases, unit LayerNorm


def hf_loss(model, ids, seg, mask, positions, labels, nsp_labels):
    target = torch.full(ids.shape, -100, dtype=torch.long, device=ids.device)
    keep = labels >= 0
    rows = torch.arange(ids.shape[0], device=ids.device)[:, None].expand_as(positions)
    target[rows[keep], positions[keep]] = labels[keep]
    return model(input_ids=ids, token_type_ids=seg, attention_mask=mask, labels=target,
                 next_sentence_label=nsp_labels).loss


def valid_batches(args):
    """The first --eval-rows rows of DIR/valid, in batches of 64."""
    import h5py
    keys = ("input_ids", "segment_ids", "input_mask", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels")
    rows = {k: [] for k in keys}
    for path in sorted(glob.glob(os.path.join(args.data, "valid", "*.hdf5"))):
        with h5py.File(path, "r") as f:
            for k in keys:
                rows[k].extend(np.asarray(f[k][:], dtype=np.int64))
    n = min(args.eval_rows, len(rows["input_ids"]))
    out = []
    for b in range(0, n, 64):
        d = {k: torch.from_numpy(np.stack(v[b:min(b + 64, n)])) for k, v in rows.items()}
        pos, mid = d["masked_lm_positions"], d["masked_lm_ids"]
        real = torch.cumprod((pos != 0).long(), 1).bool()
        out.append((d["input_ids"], d["segment_ids"], d["input_mask"], torch.where(real, pos, 0),
                    torch.where(real, mid, -1), d["next_sentence_labels"]))
    return out


def evaluate(model, batches):
    """Cohort's eval loss: summed MLM loss over all predictions / their count
    plus summed NSP loss / samples (the mirror model, no dropout)."""
    model.eval()
    mlm = nsp = preds = samples = 0.0
    with torch.no_grad():
        for ids, seg, mask, positions, labels, nsp_labels in batches:
            m, n, p = model.losses(ids, seg, mask, positions, labels, nsp_labels)
            mlm, nsp, preds, samples = mlm + m, nsp + n, preds + p, samples + ids.shape[0]
    model.train()
    return mlm / preds + nsp / samples


def own_address(master_host):
    """The IPv4 address others reach this process at: GLOO_SOCKET_IFNAME's
    (the interface Gloo uses), else the one this host reaches master_host from."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        ifname = os.environ.get("GLOO_SOCKET_IFNAME", "").split(",")[0]
        if ifname:
            import fcntl
            import struct
            req = struct.pack("256s", ifname[:15].encode())
            return socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24])  # SIOCGIFADDR
        s.connect((master_host, 9))
        return s.getsockname()[0]
    finally:
        s.close()


def model_fragments(model, n):
    """Streaming DiLoCo's fragments: fragment i holds encoder layers i, i+n,
    ...; fragment 0 also the embeddings, the heads and the decoder bias."""
    if n <= 1:
        return [model]
    if len(model.layers) < n:
        raise SystemExit("--fragments %d > %d layers" % (n, len(model.layers)))
    frags = [nn.ModuleList(list(model.layers)[i::n]) for i in range(n)]
    rest = nn.ModuleList([m for name, m in model.named_children() if name != "layers"])
    frags[0] = nn.ModuleList([rest, frags[0], nn.ParameterList([model.bias])])
    ids = [id(p) for f in frags for p in f.parameters()]
    assert sorted(ids) == sorted(id(p) for p in model.parameters()), "fragments must cover every parameter once"
    return frags


def diloco_setup(args, rank, model, opt):
    """torchft's DiLoCo over this rank's replica group of one process: its
    TCPStore, a Manager (rank 0 first starts the lighthouse) on a
    ProcessGroupGloo across the replicas. Returns (manager, diloco, lighthouse)."""
    from torchft import Manager, ProcessGroupGloo
    from torchft.local_sgd import DiLoCo
    from torch.distributed import TCPStore
    host, _, port = (args.master or "127.0.0.1:%d" % args.port).rpartition(":")
    me = own_address(host)
    lh_port = args.lighthouse_port or int(port) + 1
    lighthouse = None
    if args.lighthouse:
        lh_addr = args.lighthouse
    else:
        lh_addr = "http://%s:%d" % (host, lh_port)
        if rank == 0:
            from torchft.coordination import LighthouseServer
            # min_replicas = every rank: a sync waits for all of them, as DDP does
            lighthouse = LighthouseServer(bind="[::]:%d" % lh_port, min_replicas=args.ranks, join_timeout_ms=100,
                                          quorum_tick_ms=10)
        else:  # wait for rank 0's lighthouse to listen
            deadline = time.monotonic() + 120
            while True:
                try:
                    socket.create_connection((host, lh_port), timeout=5).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
    store_port = (args.store_port or int(port) + 2) + rank
    store = TCPStore(host_name=me, port=store_port, is_master=True, wait_for_workers=False)
    long = timedelta(seconds=args.diloco_timeout)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=long),
        load_state_dict=lambda sd: (model.load_state_dict(sd["model"]), opt.load_state_dict(sd["optim"])),
        state_dict=lambda: {"model": model.state_dict(), "optim": opt.state_dict()},
        min_replica_size=args.ranks, use_async_quorum=False, timeout=long, quorum_timeout=long,
        connect_timeout=timedelta(seconds=120), rank=0, world_size=1, store_addr=me, store_port=store_port,
        lighthouse_addr=lh_addr, replica_id="replica%d" % rank, hostname=me,
        init_sync=False)  # every rank starts from the same weights (torch.manual_seed(1))
    manager._cohort_store = store  # keep the store's server alive with the manager
    frags = model_fragments(model, args.fragments)
    outer = [torch.optim.SGD(f.parameters(), lr=args.outer_lr, momentum=args.outer_momentum,
                             nesterov=args.outer_momentum > 0) for f in frags]
    diloco = DiLoCo(manager, frags, opt, outer, sync_every=args.sync_every, fragment_sync_delay=args.fragment_delay,
                    fragment_update_alpha=args.alpha)
    return manager, diloco, lighthouse


def worker(rank, args, out):
    torch.set_num_threads(args.threads)
    if args.ranks > 1 and not args.diloco:
        host, _, port = (args.master or "127.0.0.1:%d" % args.port).rpartition(":")
        os.environ["MASTER_ADDR"] = host
        os.environ["MASTER_PORT"] = port
        dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.manual_seed(1)
    if args.model == "hf":
        model = hf_model(args)
        step_loss = lambda m, batch: hf_loss(m, *batch)
    else:
        model = Bert(args.vocab, args.hidden, args.layers, args.heads, args.intermediate or 4 * args.hidden, 512, 0.1)
        masked = args.mlm == "masked"
        step_loss = lambda m, batch: m(*batch, masked)
    dev = torch.device(args.device)
    model.to(dev)
    model.train()
    plain = model
    if args.ranks > 1 and not args.diloco:
        if args.hook == "powersgd":
            # On Gloo, powerSGD_hook with several buckets issues the P and Q
            # all-reduces of different buckets from different threads, in an
            # order that differs between ranks ("collective mismatch"): one
            # bucket for everything (no overlap with backward) is what runs.
            dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 31
            model = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=2048)
        else:
            model = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=args.optimizer != "adamw")
        if args.hook == "powersgd":
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
            state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=args.powersgd_rank,
                                           start_powerSGD_iter=2, warm_start=True, use_error_feedback=True)
            model.register_comm_hook(state, powersgd.powerSGD_hook)
    evals = valid_batches(args) if args.eval_every else []
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    groups = [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}]
    if args.optimizer == "zero":  # ZeRO stage 1: each rank keeps AdamW's state of its share of the parameters
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(decay, optimizer_class=torch.optim.AdamW, lr=args.lr, eps=1e-6, weight_decay=0.01)
        opt.add_param_group({"params": no_decay, "weight_decay": 0.0})
    elif args.optimizer == "sgd":  # no optimizer state: the memory baseline
        opt = torch.optim.SGD(groups, lr=args.lr)
    else:
        opt = torch.optim.AdamW(groups, lr=args.lr, eps=1e-6)
    manager = diloco = lighthouse = None
    if args.diloco:
        manager, diloco, lighthouse = diloco_setup(args, rank, model, opt)
        diloco.__enter__()  # its hooks on opt.step(): the inner step, then the outer sync every H / F steps
    batches = shard_batches(args, rank) if args.data else synthetic_batches(args, rank)
    times, tokens = [], []
    for step in range(1, args.steps + 1):
        batch = tuple(t.to(dev, non_blocking=True) for t in next(batches))
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = step_loss(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        tokens.append(int(batch[2].sum()))
        if args.eval_every and (step % args.eval_every == 0 or step == args.steps) and rank == 0:
            print(json.dumps({"step": step, "train_s": sum(times), "loss": evaluate(plain, evals)}), flush=True)
    if args.report_memory:  # this rank's peak resident memory, before anything is torn down
        import resource
        print(json.dumps({"rank": rank, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}),
              flush=True)
    # Steady state: drop the first quarter; the rate over what remains, with
    # every rank's real tokens (ranks hold different rows) over rank 0's time.
    k = args.steps // 4
    real = torch.tensor([float(sum(tokens[k:]))], dtype=torch.float64)
    if diloco is not None:
        diloco.__exit__(None, None, None)
        if manager._quorum_future is None:  # no sync yet (every rank alike): a quorum for the sum
            manager.start_quorum()
        manager.allreduce(real, reduce_op=dist.ReduceOp.SUM).wait()  # also all ranks' last collective
        print(json.dumps({"rank": rank, "diloco_syncs": manager.current_step(),
                          "commit_failures": manager._commit_failures}), file=sys.stderr, flush=True)
    elif args.ranks > 1:
        dist.all_reduce(real)
    if rank == 0:
        step_s = sorted(times[k:])[len(times[k:]) // 2]
        rate = real.item() / sum(times[k:])
        out.put({"ranks": args.ranks, "step_ms": step_s * 1e3, "tokens_per_s": rate,
                 "samples_per_s": args.batch * args.ranks * len(times[k:]) / sum(times[k:]),
                 "torch": torch.__version__, "model": args.model})
    if diloco is not None:
        manager.shutdown(wait=False)
        if lighthouse is not None:
            lighthouse.shutdown()
    elif args.ranks > 1:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=30522)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=0)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--predictions", type=int, default=20)
    ap.add_argument("--batch", type=int, default=16, help="per-rank batch")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--model", choices=["hf", "mirror"], default="hf")
    ap.add_argument("--mlm", choices=["all", "masked"], default="all", help="--model mirror only")
    ap.add_argument("--data", default="", help="shards from cohort prepare; default: synthetic batches")
    ap.add_argument("--port", type=int, default=29741)
    ap.add_argument("--rank", type=int, default=-1, help="this process is rank R of --ranks, started by someone else")
    ap.add_argument("--master", default="", help="ADDR:PORT of rank 0 (with --rank)")
    ap.add_argument("--hook", choices=["none", "powersgd"], default="none", help="DDP comm hook")
    ap.add_argument("--powersgd-rank", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--eval-every", type=int, default=0, help="score DIR/valid every K steps (rank 0)")
    ap.add_argument("--ids", default="", help='JSON {"steps": [[rank 0 ids, rank 1 ids, ...], ...]}: the rows '
                    "each rank reads at each step (Cohort's dealing, from log.sample-ids)")
    ap.add_argument("--eval-rows", type=int, default=512)
    ap.add_argument("--optimizer", choices=["adamw", "zero", "sgd"], default="adamw",
                    help="zero: ZeroRedundancyOptimizer over AdamW; sgd: no state (a memory baseline); zero and sgd "
                    "use DDP's gradient_as_bucket_view (one copy of the gradients)")
    ap.add_argument("--report-memory", action="store_true", help="each rank prints its peak RSS after the steps")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="one rank only on cuda")
    ap.add_argument("--diloco", action="store_true", help="torchft DiLoCo across the ranks instead of DDP")
    ap.add_argument("--sync-every", type=int, default=8, help="--diloco: H inner steps per outer sync")
    ap.add_argument("--fragments", type=int, default=1, help="--diloco: F streamed fragments (Streaming DiLoCo)")
    ap.add_argument("--fragment-delay", type=int, default=0, help="--diloco: steps a fragment's sync overlaps")
    ap.add_argument("--alpha", type=float, default=0.0, help="--diloco: fragment_update_alpha (0: the global weights)")
    ap.add_argument("--outer-lr", type=float, default=1.0, help="--diloco: the outer SGD's lr")
    ap.add_argument("--outer-momentum", type=float, default=0.0, help="--diloco: its Nesterov momentum (0: none)")
    ap.add_argument("--lighthouse", default="", help="--diloco: http://ADDR:PORT of a running torchft lighthouse; "
                    "default: rank 0 runs one on --lighthouse-port")
    ap.add_argument("--lighthouse-port", type=int, default=0, help="--diloco: default --master's port + 1")
    ap.add_argument("--store-port", type=int, default=0,
                    help="--diloco: rank R's TCPStore listens on this + R (default --master's port + 2)")
    ap.add_argument("--diloco-timeout", type=int, default=600, help="--diloco: seconds for quorums and collectives")
    args = ap.parse_args()
    if args.diloco and (args.optimizer == "zero" or args.hook != "none" or args.fragments > 1 and args.model != "mirror"):
        ap.error("--diloco takes no --optimizer zero nor --hook, and --fragments > 1 takes --model mirror")
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    if args.rank >= 0:
        worker(args.rank, args, out)
        if args.rank == 0:
            print(json.dumps(out.get()))
        return
    if args.ranks > 1:
        mp.spawn(worker, args=(args, out), nprocs=args.ranks, join=True)
    else:
        worker(0, args, out)
    print(json.dumps(out.get()))


if __name__ == "__main__":
    main()
