#!/usr/bin/env python3
"""The GEMV family against cuBLAS, from bench_core's Google Benchmark JSON (BM_CudaGemv).

For each shape (N x K, bf16 weights, M = 1) and each variant (cuBLAS, then the family's versions
by number) it prints the time, GB/s and share of the read ceiling measured in the same run, and
names the fastest variant and whether the fastest of our versions beats cuBLAS. A variant whose
check against the float64 product failed shows its error instead of figures. With a second
argument the same table is written there as JSON.

    tools/gemv_table.py bench_core.json [gemv.json]
"""
import json
import sys

TO_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def variant_name(v):
    return "cuBLAS" if v == 0 else f"v{v}"


def read(path):
    with open(path) as f:
        data = json.load(f)  # a run cut at its time limit may leave it unfinished: main() says so
    shapes = {}
    for b in data.get("benchmarks", []):
        parts = b.get("name", "").split("/")
        if parts[0] != "BM_CudaGemv" or b.get("run_type") == "aggregate" or len(parts) < 4:
            continue
        n, k, v = int(parts[1]), int(parts[2]), int(parts[3])
        e = {"variant": v, "name": variant_name(v), "label": b.get("label", "")}
        if b.get("error_occurred"):
            e["error"] = b.get("error_message", "error")
        else:
            e["time_us"] = b["real_time"] * TO_SECONDS[b.get("time_unit", "ns")] * 1e6
            e["GB/s"] = b.get("GB/s")
            e["of_ceiling"] = b.get("of_bw_ceiling")
        shapes.setdefault((n, k), []).append(e)
    table = []
    for (n, k), entries in sorted(shapes.items()):
        entries.sort(key=lambda e: e["variant"])
        timed = [e for e in entries if "time_us" in e]
        row = {"N": n, "K": k, "variants": entries}
        if timed:
            row["best"] = min(timed, key=lambda e: e["time_us"])["name"]
            own = [e for e in timed if e["variant"] > 0]
            cublas = [e for e in timed if e["variant"] == 0]
            if own and cublas:
                best_own = min(own, key=lambda e: e["time_us"])
                row["best_own"] = best_own["name"]
                row["best_own_over_cublas_time"] = best_own["time_us"] / cublas[0]["time_us"]
        table.append(row)
    return {"source": path, "context": data.get("context", {}), "shapes": table}


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    try:
        t = read(sys.argv[1])
    except (OSError, ValueError, KeyError) as e:
        print(f"gemv_table: cannot read {sys.argv[1]}: {e}")
        return
    if not t["shapes"]:
        print(f"gemv_table: no BM_CudaGemv results in {sys.argv[1]}")
        return
    names = sorted({e["name"] for s in t["shapes"] for e in s["variants"]}, key=lambda n: (n != "cuBLAS", n))
    print("GEMV at M = 1, bf16 weights: time (us), GB/s, share of the measured read ceiling; best; best own / cuBLAS time")
    print(f"{'N x K':>14} " + " ".join(f"{n:>22}" for n in names) + f" {'best':>7} {'own/cuBLAS':>10}")
    for s in t["shapes"]:
        cells = []
        for n in names:
            e = next((e for e in s["variants"] if e["name"] == n), None)
            if e is None:
                cells.append(f"{'-':>22}")
            elif "error" in e:
                cells.append(f"{'check failed':>22}")
            else:
                cells.append(f"{e['time_us']:8.1f} {e['GB/s']:6.0f} {100 * e['of_ceiling']:5.1f}%")
        ratio = s.get("best_own_over_cublas_time")
        print(f"{s['N']:>6} x {s['K']:<5} " + " ".join(cells) + f" {s.get('best', '-'):>7} " +
              (f"{ratio:10.3f}" if ratio is not None else f"{'-':>10}"))
    for s in t["shapes"]:
        for e in s["variants"]:
            if "error" in e:
                print(f"  {s['N']} x {s['K']} {e['name']}: {e['error']}")
    if len(sys.argv) == 3:
        with open(sys.argv[2], "w") as f:
            json.dump(t, f, indent=1)


if __name__ == "__main__":
    main()
