#!/usr/bin/env python3
"""Writes tests/golden/golden.safetensors: reference numbers from PyTorch for
tests/golden_test.cpp. Run with the torch of Cohort's environment:

    /opt/cohort/venv/bin/python3 tests/golden/make_golden.py

Contents (all float64 unless noted):
  bert.param.<hf name>    float32 weights of a tiny BERT (V=50, H=16, L=2, A=2, I=32)
  bert.in.<name>          int64 inputs: a padded batch of 3 with masked positions
  bert.out.mlm_sum, bert.out.nsp_sum, bert.out.mlm_count, bert.out.nsp_count
  bert.grad.<hf name>     d(mlm_sum/M + nsp_sum/B)/d(param)
  optim.<name>.w, optim.<name>.b   a weight [5,4] and bias [4] after 20 steps
  optim.w0, optim.b0, optim.gw, optim.gb   the start values and the 20 gradients
  sched.<kind>            20 learning rates, one per step

The BERT here is written from the paper and Hugging Face's module layout, in
float64, independently of Cohort's C++ model. AdamW is torch.optim.AdamW.
LAMB follows You et al. (2019), Algorithm 2, with Adam bias correction as in
NVIDIA's recipe. Schedules use torch.optim.lr_scheduler.
"""
import json
import math
import os
import struct
from collections import OrderedDict

import torch

torch.manual_seed(1234)
V, H, L, A, I, MAXPOS, TYPES = 50, 16, 2, 2, 32, 24, 2
B, S, P = 3, 10, 4
EPS = 1e-12


def bert_param_shapes():
    shapes = OrderedDict()
    e = "bert.embeddings."
    shapes[e + "word_embeddings.weight"] = (V, H)
    shapes[e + "position_embeddings.weight"] = (MAXPOS, H)
    shapes[e + "token_type_embeddings.weight"] = (TYPES, H)
    shapes[e + "LayerNorm.weight"] = (H,)
    shapes[e + "LayerNorm.bias"] = (H,)
    for l in range(L):
        p = "bert.encoder.layer.%d." % l
        for m in ("query", "key", "value"):
            shapes[p + "attention.self.%s.weight" % m] = (H, H)
            shapes[p + "attention.self.%s.bias" % m] = (H,)
        shapes[p + "attention.output.dense.weight"] = (H, H)
        shapes[p + "attention.output.dense.bias"] = (H,)
        shapes[p + "attention.output.LayerNorm.weight"] = (H,)
        shapes[p + "attention.output.LayerNorm.bias"] = (H,)
        shapes[p + "intermediate.dense.weight"] = (I, H)
        shapes[p + "intermediate.dense.bias"] = (I,)
        shapes[p + "output.dense.weight"] = (H, I)
        shapes[p + "output.dense.bias"] = (H,)
        shapes[p + "output.LayerNorm.weight"] = (H,)
        shapes[p + "output.LayerNorm.bias"] = (H,)
    shapes["bert.pooler.dense.weight"] = (H, H)
    shapes["bert.pooler.dense.bias"] = (H,)
    shapes["cls.predictions.bias"] = (V,)
    shapes["cls.predictions.transform.dense.weight"] = (H, H)
    shapes["cls.predictions.transform.dense.bias"] = (H,)
    shapes["cls.predictions.transform.LayerNorm.weight"] = (H,)
    shapes["cls.predictions.transform.LayerNorm.bias"] = (H,)
    shapes["cls.seq_relationship.weight"] = (2, H)
    shapes["cls.seq_relationship.bias"] = (2,)
    return shapes


def make_params():
    params = OrderedDict()
    for name, shape in bert_param_shapes().items():
        if name.endswith("LayerNorm.weight"):
            t = 1.0 + 0.1 * torch.randn(shape)
        else:
            t = 0.3 * torch.randn(shape)  # large enough that every gradient matters
        params[name] = t.float()
    return params


def gelu(x):
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def layer_norm(x, w, b):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + EPS) * w + b


def linear(x, p, name):
    return x @ p[name + ".weight"].t() + p[name + ".bias"]


def bert_losses(p, ids, seg, mask, positions, labels, nsp_labels):
    x = p["bert.embeddings.word_embeddings.weight"][ids]
    x = x + p["bert.embeddings.position_embeddings.weight"][torch.arange(ids.shape[1])][None]
    x = x + p["bert.embeddings.token_type_embeddings.weight"][seg]
    x = layer_norm(x, p["bert.embeddings.LayerNorm.weight"], p["bert.embeddings.LayerNorm.bias"])
    bias = ((1.0 - mask.double()) * -10000.0)[:, None, None, :]
    d = H // A
    for l in range(L):
        n = "bert.encoder.layer.%d." % l
        def heads(t):
            return t.view(B, -1, A, d).transpose(1, 2)
        q = heads(linear(x, p, n + "attention.self.query"))
        k = heads(linear(x, p, n + "attention.self.key"))
        v = heads(linear(x, p, n + "attention.self.value"))
        probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d) + bias, -1)
        ctx = (probs @ v).transpose(1, 2).reshape(B, -1, H)
        a = layer_norm(linear(ctx, p, n + "attention.output.dense") + x,
                       p[n + "attention.output.LayerNorm.weight"], p[n + "attention.output.LayerNorm.bias"])
        h = gelu(linear(a, p, n + "intermediate.dense"))
        x = layer_norm(linear(h, p, n + "output.dense") + a,
                       p[n + "output.LayerNorm.weight"], p[n + "output.LayerNorm.bias"])
    pooled = torch.tanh(linear(x[:, 0], p, "bert.pooler.dense"))
    nsp_logits = linear(pooled, p, "cls.seq_relationship")
    keep = labels.reshape(-1) >= 0
    rows = x.gather(1, positions.clamp(min=0)[..., None].expand(B, P, H)).reshape(-1, H)[keep]
    t = gelu(linear(rows, p, "cls.predictions.transform.dense"))
    t = layer_norm(t, p["cls.predictions.transform.LayerNorm.weight"], p["cls.predictions.transform.LayerNorm.bias"])
    mlm_logits = t @ p["bert.embeddings.word_embeddings.weight"].t() + p["cls.predictions.bias"]
    mlm_sum = torch.nn.functional.cross_entropy(mlm_logits, labels.reshape(-1)[keep], reduction="sum")
    nsp_sum = torch.nn.functional.cross_entropy(nsp_logits, nsp_labels, reduction="sum")
    return mlm_sum, nsp_sum, int(keep.sum())


def bert_golden(out):
    params = make_params()
    lengths = [10, 8, 6]
    ids = torch.randint(5, V, (B, S))
    mask = torch.zeros(B, S, dtype=torch.long)
    seg = torch.zeros(B, S, dtype=torch.long)
    for r, n in enumerate(lengths):
        mask[r, :n] = 1
        ids[r, n:] = 0
        ids[r, 0] = 2  # [CLS]
        seg[r, n // 2:n] = 1
    # NVIDIA layout: positions 0-padded; Cohort's reader turns the padded ids into -1.
    positions = torch.tensor([[1, 3, 4, 8], [2, 5, 7, 0], [1, 4, 0, 0]])
    labels = torch.tensor([[7, 12, 30, 44], [9, 10, 21, -1], [33, 6, -1, -1]])
    nsp_labels = torch.tensor([0, 1, 1])
    p64 = {k: v.double().requires_grad_(True) for k, v in params.items()}
    mlm_sum, nsp_sum, m = bert_losses(p64, ids, seg, mask, positions, labels, nsp_labels)
    (mlm_sum / m + nsp_sum / B).backward()
    for k, v in params.items():
        out["bert.param." + k] = v
        out["bert.grad." + k] = p64[k].grad
    for k, v in dict(input_ids=ids, segment_ids=seg, input_mask=mask, masked_lm_positions=positions,
                     masked_lm_ids=labels, next_sentence_labels=nsp_labels).items():
        out["bert.in." + k] = v
    out["bert.out.mlm_sum"] = mlm_sum.detach().reshape(1)
    out["bert.out.nsp_sum"] = nsp_sum.detach().reshape(1)
    out["bert.out.mlm_count"] = torch.tensor([float(m)], dtype=torch.float64)
    out["bert.out.nsp_count"] = torch.tensor([float(B)], dtype=torch.float64)


LR, WD, BETAS, OPT_EPS, STEPS = 1e-2, 0.01, (0.9, 0.999), 1e-6, 20


def lamb(w, b, grads_w, grads_b):
    """LAMB (You et al. 2019, Algorithm 2): Adam moments with bias correction,
    r = m^/(sqrt(v^)+eps) + wd*w, trust ratio ||w||/||r||, as NVIDIA's FusedLAMB applies it."""
    state = {}
    for gw, gb in zip(grads_w, grads_b):
        for name, x, g, wd in (("w", w, gw, WD), ("b", b, gb, 0.0)):
            m, v, t = state.get(name, (torch.zeros_like(x), torch.zeros_like(x), 0))
            t += 1
            m = BETAS[0] * m + (1 - BETAS[0]) * g
            v = BETAS[1] * v + (1 - BETAS[1]) * g * g
            mh = m / (1 - BETAS[0] ** t)
            vh = v / (1 - BETAS[1] ** t)
            r = mh / (vh.sqrt() + OPT_EPS) + wd * x
            # apex FusedLAMB with use_nvlamb=False: no trust ratio where there is no decay.
            wn, rn = float(x.norm()), float(r.norm())
            ratio = wn / rn if wd != 0 and wn > 0 and rn > 0 else 1.0
            x -= LR * ratio * r
            state[name] = (m, v, t)
    return w, b


def optim_golden(out):
    w0 = torch.randn(5, 4, dtype=torch.float64)
    b0 = torch.randn(4, dtype=torch.float64)
    gw = torch.randn(STEPS, 5, 4, dtype=torch.float64)
    gb = torch.randn(STEPS, 4, dtype=torch.float64)
    out.update({"optim.w0": w0, "optim.b0": b0, "optim.gw": gw, "optim.gb": gb})
    w, b = w0.clone().requires_grad_(True), b0.clone().requires_grad_(True)
    opt = torch.optim.AdamW([{"params": [w], "weight_decay": WD}, {"params": [b], "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=OPT_EPS)
    for k in range(STEPS):
        w.grad, b.grad = gw[k].clone(), gb[k].clone()
        opt.step()
    out["optim.adamw.w"], out["optim.adamw.b"] = w.detach(), b.detach()
    out["optim.lamb.w"], out["optim.lamb.b"] = lamb(w0.clone(), b0.clone(), gw, gb)


PEAK, WARMUP, TOTAL, MIN_RATIO, POWER = 1e-3, 5, 20, 0.1, 2.0


def lr_after(make_decay, k):
    """The lr for 0-based step k: warmup (k+1)/W of peak, then the decay scheduler at k-W."""
    from torch.optim import lr_scheduler as sch
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=PEAK)
    if k < WARMUP:
        s = sch.LinearLR(opt, start_factor=1.0 / WARMUP, end_factor=1.0, total_iters=WARMUP - 1)
        steps = k
    else:
        s = make_decay(opt)
        steps = k - WARMUP
    for _ in range(steps):
        opt.step()
        s.step()
    return opt.param_groups[0]["lr"]


def sched_golden(out):
    from torch.optim import lr_scheduler as sch
    span = TOTAL - WARMUP
    kinds = {
        "constant": lambda o: sch.ConstantLR(o, factor=1.0, total_iters=0),
        "linear": lambda o: sch.LinearLR(o, start_factor=1.0, end_factor=MIN_RATIO, total_iters=span),
        "cosine": lambda o: sch.CosineAnnealingLR(o, T_max=span, eta_min=PEAK * MIN_RATIO),
        # torch's PolynomialLR decays to 0: the poly golden uses min-lr-ratio 0.
        "poly": lambda o: sch.PolynomialLR(o, total_iters=span, power=POWER),
    }
    for kind, make in kinds.items():
        out["sched." + kind] = torch.tensor([lr_after(make, k) for k in range(TOTAL)], dtype=torch.float64)


def save_safetensors(path, tensors):
    dtypes = {torch.float32: "F32", torch.float64: "F64", torch.int64: "I64"}
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.detach().contiguous().numpy().tobytes()
        header[name] = {"dtype": dtypes[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"generator": "tests/golden/make_golden.py", "torch": torch.__version__}
    head = json.dumps(header, sort_keys=True).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for blob in blobs:
            f.write(blob)


def main():
    out = OrderedDict()
    bert_golden(out)
    optim_golden(out)
    sched_golden(out)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden.safetensors")
    save_safetensors(path, out)
    print("wrote %s (%d tensors)" % (path, len(out)))


if __name__ == "__main__":
    main()
