"""Mean SM clock, board power and temperature of nvidia-smi samples inside a time window.
Usage: python3 clock_samples.py SAMPLES.csv LOG
SAMPLES: nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits.
LOG: a laoyao training log (the window runs from its second iteration line's time to its last's) or
bench/peer_profile_step.py's output (its "steps from A to B" line)."""
import datetime
import re
import sys


def stamp(text):
    text = text.replace("/", "-")
    return datetime.datetime.strptime(text[:26] if "." in text else text[:19],
                                      "%Y-%m-%d %H:%M:%S.%f" if "." in text else "%Y-%m-%d %H:%M:%S")


def window(log):
    lines = open(log, errors="replace").read().splitlines()
    for line in lines:
        m = re.search(r"steps from (\S+ \S+) to (\S+ \S+)", line)
        if m:
            return stamp(m.group(1)), stamp(m.group(2))
    its = [re.match(r"\s*\[(\S+ \S+)\] iteration", l) for l in lines]
    its = [stamp(m.group(1)) for m in its if m]
    if len(its) < 3:
        sys.exit(f"{log}: fewer than three iteration lines")
    return its[1], its[-1]


def main():
    start, end = window(sys.argv[2])
    rows = []
    for line in open(sys.argv[1], errors="replace"):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        try:
            t = stamp(parts[0])
            rows.append((t, float(parts[1]), float(parts[2]), float(parts[3])))
        except ValueError:
            continue
    rows = [r for r in rows if start <= r[0] <= end]
    if not rows:
        sys.exit(f"no samples between {start} and {end}")
    mean = lambda i: sum(r[i] for r in rows) / len(rows)
    print(f"{len(rows)} samples over {(end - start).total_seconds():.1f} s: SM clock {mean(1):.0f} MHz, "
          f"power {mean(2):.0f} W, {mean(3):.0f} C")


if __name__ == "__main__":
    main()
