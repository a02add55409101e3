"""How much of a CUDA-graph step is gaps between its kernels: Nsight Compute's durations of the
same run profiled twice (ncu --csv --metrics gpu__time_duration.sum --print-units base), once with
--graph-profiling graph (each replay of the forward+backward graph one result, named "graph") and
once with --graph-profiling node (each kernel alone). A training iteration ends with the AdamW
kernel; the last whole iteration of the node profile is summed, and split into the graph's kernels
(everything before the optimizer's gradient norm) and the optimizer's.
Usage: python3 graph_gaps_summary.py GRAPH.csv NODE.csv"""
import csv
import re
import sys


def durations(path):
    """[(kernel name, ns)] in launch order."""
    with open(path, newline="") as f:
        rows = [line for line in f if line.startswith('"')]
    out = []
    for r in csv.DictReader(rows):
        if r.get("Metric Name") == "gpu__time_duration.sum":
            out.append((r["Kernel Name"], float(r["Metric Value"].replace(",", ""))))
    return out


def main(graph_csv, node_csv):
    replays = [ns / 1e6 for name, ns in durations(graph_csv) if name == "graph"]
    node = durations(node_csv)
    ends = [i for i, (name, _) in enumerate(node) if re.search(r"adamw", name, re.I)]
    if not replays or len(ends) < 2:
        sys.exit("graph_gaps_summary: need graph replays in the first profile and two AdamW kernels in the second")
    step = node[ends[-2] + 1:ends[-1] + 1]
    # The optimizer's kernels follow the graph: the gradient norm's partial and finish kernels, AdamW.
    first_opt = next(i for i, (name, _) in enumerate(step) if re.search(r"::partial_vec_kernel|adamw", name))
    in_graph = sum(ns for _, ns in step[:first_opt]) / 1e6
    optimizer = sum(ns for _, ns in step[first_opt:]) / 1e6
    gaps = [r - in_graph for r in replays]
    print("| | ms |")
    print("|---|---|")
    print(f"| the forward+backward graph, replayed alone ({len(replays)} replays) | "
          f"{min(replays):.2f}-{max(replays):.2f} |")
    print(f"| its {first_opt} kernels, each timed alone, summed | {in_graph:.2f} |")
    print(f"| gaps between the graph's kernels | {min(gaps):.2f}-{max(gaps):.2f} "
          f"({1e3 * min(gaps) / first_opt:.1f}-{1e3 * max(gaps) / first_opt:.1f} us a kernel) |")
    print(f"| the optimizer's {len(step) - first_opt} kernels after it | {optimizer:.2f} |")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
