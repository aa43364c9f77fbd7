"""Session 14 (issue 10): are samu train's slow phases the GPU's clock? For each run of call2 (optab_*.json: the
GPU stream's time a step, the host's wall clock at each step) and nvidia-smi's samples beside it (smi.csv, every
100 ms), the median SM clock over each step's window, with the window shifted by LAG steps (the host queues ahead
of the GPU; the lag is not known, so every lag of 0-8 steps is tried and the best one is a fit). Prints, per run and
lag, the clock's median in the slow steps (> 1.03 x the median step, from step 15) and in the others, how many
steps had a clock sample (nvidia-smi samples every 100 ms, a step is ~45 ms), and the correlation of step time
with 1 / clock. nvidia-smi's stamps are the device's local time, UTC there. Usage: python clocks.py FOLDER"""
import datetime
import json
import statistics
import sys
from pathlib import Path

folder = Path(sys.argv[1])
smi = []
for line in open(folder / "smi.csv"):
    p = [s.strip() for s in line.split(",")]
    try:
        t = datetime.datetime.strptime(p[0], "%Y/%m/%d %H:%M:%S.%f").replace(
            tzinfo=datetime.timezone.utc).timestamp()
    except ValueError:
        continue
    smi.append((t, float(p[1].split()[0]), float(p[3].split()[0])))
out = {}
for path in sorted(folder.glob("optab_*.json")):
    run = json.loads(path.read_text())
    gpu, host = run["gpu_ms"], run["host_time"]
    med = statistics.median(gpu[20:])
    for lag in range(9):
        rows = []
        for i in range(15, len(gpu) - lag - 1):
            a, b = host[i + lag], host[i + lag + 1]
            s = [c for t, c, _ in smi if a <= t < b]
            if s:
                rows.append((gpu[i], statistics.median(s)))
        slow = [c for g, c in rows if g > 1.03 * med]
        other = [c for g, c in rows if g <= 1.03 * med]
        xs, ys = [g for g, _ in rows], [1 / c for _, c in rows]
        corr = statistics.correlation(xs, ys) if len(rows) > 2 else float("nan")
        out[f"{path.stem}|lag{lag}"] = {"slow_MHz": statistics.median(slow) if slow else None,
                                        "other_MHz": statistics.median(other), "corr": corr, "n_slow": len(slow),
                                        "n_steps": len(rows)}
        print(f"{path.stem:10} lag {lag}: clock slow {out[f'{path.stem}|lag{lag}']['slow_MHz']} MHz "
              f"({len(slow)} steps), other {statistics.median(other)} MHz ({len(other)}), corr(step, 1/clock) {corr:.2f}")
(folder / "clocks.json").write_text(json.dumps(out, indent=1))
