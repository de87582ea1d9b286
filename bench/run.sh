#!/usr/bin/env bash
# Builds the benchmarks, starts a local cluster (1 coordinator, 4 workers on
# 127.0.0.1), and prints every figure with the reference measured in the
# same run and their ratio. Usage:
#   bench/run.sh            # full sizes (1 GiB tensors; a few minutes on 2 cores)
#   bench/run.sh --quick    # 64 MiB tensors, short runs (smoke test)
#   bench/run.sh --update   # full run, and write the table to bench/RESULTS.md
#   bench/run.sh --transport=ucx   # figure 1's gather through one transport
#                                  # (ucx, grpc, auto or shm) instead of each
# Figures 1 and 8 run once more with UCX_TLS=tcp: UCX as between hosts on a
# trusted fabric (TESSERA_TRUSTED_FABRIC=1, what workers' --trusted_fabric
# says; without it UCX stays on this host's shared memory).
set -euo pipefail
cd "$(dirname "$0")/.."

quick=""
update=""
transport=""
for arg in "$@"; do
  case "$arg" in
    --quick) quick="--quick" ;;
    --update) update=1 ;;
    --transport=*) transport="$arg" ;;
    *) echo "usage: bench/run.sh [--quick] [--update] [--transport=ucx|grpc|auto|shm]" >&2; exit 2 ;;
  esac
done

bazel build -c opt //bench:tessera_bench //bench:strided_copy_bench \
  //coordinator:tessera-coordinator //worker:tessera-worker //client:tessera \
  //client/python:all >&2

out="$(mktemp)"
trap 'rm -f "$out"' EXIT
{
  echo "# command: bench/run.sh $* ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(uname -r))"
  echo
  echo "## Figures 1-4, 7-11, 14, 16-22 (local cluster; 7: the cost of mutual TLS and tokens; 8: UCX; 9-11: serving and the CLI; 14: replicas, 18-22, in clusters of their own; 20 and 21: hosts of their own, network namespaces, needs root; 21: publishing to mirror hosts over shaped links; 22: tenants, one paced)"
  TESSERA_BIN_DIR="$PWD/bazel-bin" bazel-bin/bench/tessera_bench $quick $transport
  echo
  echo "## Figures 1 and 8 with UCX over TCP only (UCX_TLS=tcp), as between hosts"
  TESSERA_TRUSTED_FABRIC=1 UCX_TLS=tcp TESSERA_BIN_DIR="$PWD/bazel-bin" \
    bazel-bin/bench/tessera_bench $quick \
    --only=1,8 --transport=ucx
  echo
  echo "## Figure 15: tessera.aio from one event loop against 16 threads (16 concurrent 4 KiB gets, a cluster of its own)"
  PYTHONPATH="$PWD/bazel-bin/client/python" TESSERA_BIN_DIR="$PWD/bazel-bin" \
    /usr/bin/python3 bench/aio_bench.py $quick
  echo
  echo "## Figure 5: core/strided_copy vs memcpy of the same bytes (Google Benchmark, medians of 3)"
  min_time=0.5
  [ -n "$quick" ] && min_time=0.1
  bazel-bin/bench/strided_copy_bench --benchmark_min_time=$min_time --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true --benchmark_format=json 2>/dev/null |
    python3 -c '
import json, sys
rows = {b["run_name"]: b["bytes_per_second"] for b in json.load(sys.stdin)["benchmarks"]
        if b.get("aggregate_name") == "median"}
ref = rows["BM_Memcpy/real_time"]
print("| figure | value | reference (same run) | ratio | target | met? |")
print("|---|---|---|---|---|---|")
for name, bps in rows.items():
    if name.startswith("BM_Memcpy"): continue
    kind, run = name.split("/")[0:2]
    run = int(run)
    r = bps / ref
    label = "CopyBox" if kind == "BM_StridedCopy" else "CopyFlatRangeToBox"
    target = ">= 0.80x" if run >= 4096 else "-"
    met = ("yes" if r >= 0.8 else "**no**") if run >= 4096 else "-"
    size = f"{run // 1024} KiB" if run >= 1024 else f"{run} B"
    print(f"| 5. {label}, inner run {size} | {bps/1e9:.2f} GB/s | memcpy {ref/1e9:.2f} GB/s | {r:.2f}x | {target} | {met} |")
'
  echo
  echo "## Metadata durability: creates and reads with and without --data_dir (group commit)"
  bazel build -c opt //bench:metadata_bench >&2
  TESSERA_BIN_DIR="$PWD/bazel-bin" bazel-bin/bench/metadata_bench $quick
  echo
  echo "## Figure 6: geometry planning at 100k shards on adversarial layouts (Google Benchmark, medians of 3, CPU time)"
  echo "Reference: the same boxes sorted once by their offsets (region: a scan of every shard)."
  bazel build -c opt //bench:planning_bench >&2
  min_time=0.5
  [ -n "$quick" ] && min_time=0.05
  bazel-bin/bench/planning_bench --benchmark_min_time=$min_time --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true --benchmark_format=json 2>/dev/null |
    python3 -c '
import json, sys
unit = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
rows = {}
for b in json.load(sys.stdin)["benchmarks"]:
    if b.get("aggregate_name") == "median":
        rows[b["run_name"].replace("/real_time", "")] = (
            b["cpu_time"] * unit[b["time_unit"]], b.get("shards", 0), b.get("pieces"))
def fmt(t):
    return f"{t*1e3:.1f} ms" if t >= 1e-3 else f"{t*1e6:.2f} us"
print("| figure | value | reference (same run) | ratio | target | met? |")
print("|---|---|---|---|---|---|")
def row(label, name, ref_label, ref, limit):
    t, shards, pieces = rows[name]
    r = t / rows[ref][0]
    extra = f", {int(pieces):,} pieces" if pieces else ""
    target = f"<= {fmt(limit)}" if limit else "-"
    met = ("yes" if t <= limit else "**no**") if limit else "-"
    print(f"| 6. {label} ({int(shards):,} shards{extra}) | {fmt(t)} | {ref_label} {fmt(rows[ref][0])} | {r:.2g}x | {target} | {met} |")
for layout in ("rank2_shells", "rank3_shells", "rank4_suffix_tiling", "rank4_suffix_boxes"):
    sort = "Sort/" + layout
    row(f"validate {layout}", "Validate/" + layout, "sort", sort, 0.2)
    if "Reshard/" + layout in rows:
        row(f"reshard {layout} to its mirror", "Reshard/" + layout, "sort", sort, 0.2)
for n in (2500, 10000, 100000):
    row(f"reshard {n} column chunks to {n - 1}", f"ReshardColumns/{n}", "sort", f"SortColumns/{n}",
        0.2 if n == 100000 else None)
row("plan a 4 KiB region, prebuilt index", "RegionIndexed", "scan", "RegionScan", 20e-6)
row("build that index (once per layout)", "IndexBuild", "scan", "RegionScan", None)
'
} | tee "$out"

if [ -n "$update" ]; then
  {
    echo "# Benchmark results"
    echo
    echo "Latest output of \`bench/run.sh\` (regenerate with \`bench/run.sh --update\`)."
    echo "Every ratio compares against a reference measured in the same run, on the same"
    echo "machine: numbers on shared 2-core machines vary ±20-50 % between runs."
    echo
    cat "$out"
  } > bench/RESULTS.md
  echo "wrote bench/RESULTS.md" >&2
fi
