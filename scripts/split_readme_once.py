"""One-off: move the README's sections into docs/ pages (run once; its output is then edited)."""
import subprocess, re, collections, pathlib
ROOT = pathlib.Path("/work/wt-docs")
BASE = "3f840c4"
lines = subprocess.run(["git", "-C", str(ROOT), "show", f"{BASE}:README.md"], capture_output=True, text=True, check=True).stdout.splitlines()
# blame: line -> (commit, date)
blame = subprocess.run(["git", "-C", str(ROOT), "blame", "--line-porcelain", BASE, "--", "README.md"], capture_output=True, text=True, check=True).stdout.splitlines()
info, commits, cur = {}, [], None
for l in blame:
    m = re.match(r"^([0-9a-f]{40}) \d+ (\d+)", l)
    if m:
        cur = m.group(1); continue
    if l.startswith("committer-time "):
        info.setdefault(cur, int(l.split()[1]))
    if l.startswith("\t"):
        commits.append(cur)
assert len(commits) == len(lines), (len(commits), len(lines))

# (first-line prefix, destination, results title or None)
SEGMENTS = [
    ("# opdvfs", "SKIP", None),
    ("On your own training script", "guide/tune.md#quick", None),
    ("**opdvfs** cuts the energy", "index.md", None),
    ("## Status", "status.md", None),
    ("## The demo: the pipeline end to end", "guide/demo.md", None),
    ("What the numbers say: the AICore", "results.md", "The demo: what the numbers say, and the thermal bias"),
    ("`opdvfs evaluate --out DIR` measures", "guide/demo.md", None),
    ("GPT-3 at 2–10%: AICore power", "results.md", "evaluate: the paper's Table 3 and Fig. 18 on the twin"),
    ("## The pipeline", "guide/pipeline.md", None),
    ("## The simulated accelerator", "guide/simulator.md", None),
    ("## Performance models", "guide/performance-models.md", None),
    ("| data (held-out clocks) | func2", "results.md", "Performance models: accuracy, fitting speed, scale"),
    ("The MODELS file records the device", "guide/performance-models.md", None),
    ("## Power models", "guide/power-models.md", None),
    ("`benchmarks/power_models.py` prints", "results.md", "Power models: accuracy on held-out clocks"),
    ("**Coarse sensors need long runs.**", "guide/power-models.md", None),
    ("## A GPU opdvfs has no preset", "guide/characterise.md", None),
    ("`benchmarks/model_generalisation.py` scores", "results.md", "Generalisation: leave-one-GPU-out on real GPUs"),
    ("Two clocks with no device: the rise", "guide/characterise.md", None),
    ("## Planning", "guide/planning.md", None),
    ("(simulated ascend-910b-like, objective AICore energy):", "results.md", "Planners: DP, GA, and the exact optimum on real Perseus profiles"),
    ("### A whole pipeline-parallel job (#20)", "guide/pipeline-parallel.md", None),
    ("`benchmarks/pipeline_planning.py --exact-seconds 30", "results.md", "Pipeline-parallel planning on the Perseus instances, and against lowtime"),
    ("**From the profiles of a real job's ranks.**", "guide/pipeline-parallel.md", None),
    ("## The closed loop: `opdvfs tune`", "guide/tune.md", None),
    ("**A host that runs ahead of the simulated GPU.**", "results.md", "tune on the simulated GPU: a host that runs ahead, tune vs offline"),
    ("On a real GPU (`nvml`, `zeusd`, or `dry-run`", "guide/tune.md", None),
    ("- 400 eager steps: 2 warm-up", "results.md", "tune on a real H200 (read-only, dry-run actuator)"),
    ("Under torchrun every rank measures and rank 0 leads:", "guide/tune.md", None),
    ("## Applying a schedule to PyTorch", "guide/run-and-capture.md", None),
    ("- Host cost (`benchmarks/executor_overhead.py`", "results.md", "The executor: host cost, and op vs time triggers within a budget"),
    ("or from Python:", "guide/run-and-capture.md", None),
    ("## Worked example on real data", "guide/real-data.md", None),
    ("## Input formats", "guide/input-formats.md", None),
    ("## Development", "development.md", None),
]
starts = []
for prefix, dest, title in SEGMENTS:
    idx = [i for i, l in enumerate(lines) if l.startswith(prefix)]
    assert len(idx) >= 1, prefix
    starts.append(idx[0])
assert starts == sorted(starts), starts
out = collections.defaultdict(list)
for k, (prefix, dest, title) in enumerate(SEGMENTS):
    a = starts[k]; b = starts[k + 1] if k + 1 < len(SEGMENTS) else len(lines)
    chunk = lines[a:b]
    while chunk and not chunk[-1].strip():
        chunk.pop()
    if dest == "SKIP":
        continue
    if title:
        seg_commits = {commits[i] for i in range(a, b) if lines[i].strip()}
        newest = max(seg_commits, key=lambda c: info[c])
        import datetime
        d = datetime.datetime.fromtimestamp(info[newest], datetime.UTC).strftime("%Y-%m-%d")
        out[dest.split("#")[0]].append((title, newest[:10], d, chunk, sorted({c[:10] for c in seg_commits})))
    else:
        out[dest.split("#")[0]].append(chunk)
for dest, parts in out.items():
    p = ROOT / "docs" / dest.split("#")[0]
    p.parent.mkdir(parents=True, exist_ok=True)
    text = []
    for part in parts:
        if isinstance(part, tuple):
            title, c, d, chunk, allc = part
            text.append(f"## {title}\n\n**Commit** `{c}` ({d}; the last of the {len(allc)} commits that wrote this section: {', '.join(allc)})\n")
            text.append("\n".join(chunk) + "\n")
        else:
            text.append("\n".join(part) + "\n")
    p.write_text("\n".join(text))
    print(dest, sum(len(t.splitlines()) for t in text))
