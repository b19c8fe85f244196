"""The layering of src/cohort, checked: a subsystem includes only its own
headers and those of the layers below it (docs/design.md, Layout).

    core -> config -> text, obs, eval -> device -> data, distributed
         -> model, ckpt, prep, sync -> train -> launch

distributed/ is transport (World, rendezvous, Comm, membership); sync/ is
the algorithms that keep replicas together over it (GradSync, PowerSGD,
local steps, the shard layout).

Inside train/, by concern: task.hpp (the extension point) and tasks/ at
the bottom; optimization/ (precision, optimizers, the sharded optimizer,
the outer stage) and lifecycle/ (the run directory and its lock,
checkpoints kept, the state that survives a run or a world, start-up
agreement) beside each other; loop/ (the Trainer and its step) above
them; elastic/ (the driver of the worlds, above the Trainer) on top.

The layers below data/ and prep/ never include torch (CMakeLists.txt
compiles them without its precompiled header). Exits 1 naming every include
that runs the other way, and every torch include where none may be."""
import os
import re
import sys

LAYERS = [["core"], ["config"], ["text", "obs", "eval"], ["device"], ["data", "distributed"],
          ["model", "ckpt", "prep", "sync"], ["train"], ["launch"]]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}
TORCH_FREE = {"core", "config", "text", "obs", "eval", "prep"}

root = os.path.join(sys.argv[1] if len(sys.argv) > 1 else ".", "src", "cohort")
bad, seen = [], 0
for sub in sorted(os.listdir(root)):
    path = os.path.join(root, sub)
    if not os.path.isdir(path):
        continue
    if sub not in RANK:
        bad.append(f"src/cohort/{sub}/: a subsystem with no layer; add it to tests/layers.py and docs/design.md")
        continue
    for dirpath, _, files in os.walk(path):
        for f in sorted(files):
            if not f.endswith((".hpp", ".cpp", ".inc")):
                continue
            file = os.path.join(dirpath, f)
            for n, line in enumerate(open(file, encoding="utf-8"), 1):
                if sub in TORCH_FREE and re.match(r'\s*#\s*include\s+[<"](torch|ATen|c10)/', line):
                    bad.append(f"{os.path.relpath(file, os.path.dirname(os.path.dirname(root)))}:{n}: "
                               f"{sub} includes torch ({line.strip()}); it is compiled without torch")
                m = re.match(r'\s*#\s*include\s+"cohort/(\w+)/', line)
                if not m:
                    continue
                seen += 1
                to = m.group(1)
                if to != sub and RANK.get(to, 99) >= RANK[sub]:
                    bad.append(f"{os.path.relpath(file, os.path.dirname(os.path.dirname(root)))}:{n}: "
                               f"{sub} (layer {RANK[sub]}) includes cohort/{to}/ (layer {RANK.get(to, '?')})")
# train/'s folders, in the same way: a folder includes its own, its peers'
# and those below.
TRAIN = [["", "tasks"], ["optimization", "lifecycle"], ["loop"], ["elastic"]]
TRAIN_RANK = {name: i for i, names in enumerate(TRAIN) for name in names}
train_root = os.path.join(root, "train")
for dirpath, _, files in os.walk(train_root):
    sub = os.path.relpath(dirpath, train_root).replace(".", "")
    if sub not in TRAIN_RANK:
        bad.append(f"src/cohort/train/{sub}/: a folder with no place in train/; add it to tests/layers.py")
        continue
    for f in sorted(files):
        file = os.path.join(dirpath, f)
        for n, line in enumerate(open(file, encoding="utf-8"), 1):
            m = re.match(r'\s*#\s*include\s+"cohort/train/(?:(\w+)/)?\w+\.hpp"', line)
            if not m:
                continue
            seen += 1
            to = m.group(1) or ""
            if TRAIN_RANK.get(to, 99) > TRAIN_RANK[sub]:
                bad.append(f"{os.path.relpath(file, os.path.dirname(os.path.dirname(root)))}:{n}: "
                           f"train/{sub or '.'} includes train/{to or '.'}/, a folder above it")
for b in bad:
    print(b)
print(f"layers: {seen} includes checked, {len(bad)} against the layering")
sys.exit(1 if bad or seen == 0 else 0)
