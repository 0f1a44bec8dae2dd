#!/usr/bin/env python3
"""The GEMV family against cuBLAS, from bench_core's Google Benchmark JSON (BM_CudaGemv); with
--quant, the quantised GEMV's versions against the bf16 GEMV, from bench_quant's (BM_CudaQgemv).

For each shape (N x K, bf16 weights, M = 1) and each variant (cuBLAS, then the family's versions
by number) it prints the time, GB/s and share of the read ceiling measured in the same run, and
names the fastest variant and whether the fastest of our versions beats cuBLAS. A variant whose
check against the float64 product failed shows its error instead of figures. With a second
argument the same table is written there as JSON.

    tools/gemv_table.py bench_core.json [gemv.json]
    tools/gemv_table.py --quant bench_quant.json [qgemv.json]

The quantised table has a row per format and shape (N x K, M = 1): each version's time, GB/s of
the format's own bytes and share of the read ceiling, its speed over the bf16 GEMV at the same
shape (timed in the same run), and the best version.
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


def read_quant(path):
    with open(path) as f:
        data = json.load(f)
    rows = {}
    for b in data.get("benchmarks", []):
        parts = b.get("name", "").split("/")
        if parts[0] != "BM_CudaQgemv" or b.get("run_type") == "aggregate" or len(parts) < 4:
            continue
        label = b.get("label", "").split()  # "<format> <N>x<K> v<version>"
        version = int(parts[1])
        if len(label) == 3:
            fmt, shape = label[0], label[1]
        else:  # an error leaves no label: the arguments name the case
            fmt, shape = f"format {parts[2]}", f"shape {parts[3]}"
        e = {"version": version}
        if b.get("error_occurred"):
            e["error"] = b.get("error_message", "error")
        else:
            e["time_us"] = b["real_time"] * TO_SECONDS[b.get("time_unit", "ns")] * 1e6
            for key in ("GB/s", "of_ceiling", "vs_bf16", "bf16_us", "bits/w"):
                e[key] = b.get(key)
        rows.setdefault((fmt, shape), []).append(e)
    table = []
    for (fmt, shape), entries in rows.items():
        entries.sort(key=lambda e: e["version"])
        row = {"format": fmt, "shape": shape, "versions": entries}
        timed = [e for e in entries if "time_us" in e]
        if timed:
            best = min(timed, key=lambda e: e["time_us"])
            row["best"] = f"v{best['version']}"
            row["best_vs_bf16"] = best["vs_bf16"]
        table.append(row)
    return {"source": path, "context": data.get("context", {}), "rows": table}


def load(read_fn, path, key, bench):
    """The table read_fn makes of path, or None after saying why there is none."""
    try:
        t = read_fn(path)
    except (OSError, ValueError, KeyError) as e:
        print(f"gemv_table: cannot read {path}: {e}")
        return None
    if not t[key]:
        print(f"gemv_table: no {bench} results in {path}")
        return None
    return t


def cells(entries, names, name_of, width, figures):
    """One cell per name: the entry's figures, its failed check, or '-' where it did not run."""
    out = []
    for n in names:
        e = next((e for e in entries if name_of(e) == n), None)
        out.append(f"{'-':>{width}}" if e is None else f"{'check failed':>{width}}" if "error" in e else figures(e))
    return out


def finish(t, key, entries_key, where, name_of, args):
    """The failed checks' messages under the table, then the table as JSON where a path was given."""
    for r in t[key]:
        for e in r[entries_key]:
            if "error" in e:
                print(f"  {where(r)} {name_of(e)}: {e['error']}")
    if len(args) == 2:
        with open(args[1], "w") as f:
            json.dump(t, f, indent=1)


def main_quant(args):
    t = load(read_quant, args[0], "rows", "BM_CudaQgemv")
    if t is None:
        return
    versions = sorted({e["version"] for r in t["rows"] for e in r["versions"]})
    print("Quantised GEMV at M = 1: per version time (us), GB/s, share of the read ceiling, speed over bf16; best")
    print(f"{'format':>16} {'N x K':>12} " + " ".join(f"{'v' + str(v):>30}" for v in versions) +
          f" {'best':>5} {'x bf16':>7}")
    for r in t["rows"]:
        row = cells(r["versions"], versions, lambda e: e["version"], 30,
                    lambda e: f"{e['time_us']:8.1f} {e['GB/s']:6.0f} {100 * e['of_ceiling']:5.1f}% {e['vs_bf16']:5.2f}x")
        best = r.get("best_vs_bf16")
        print(f"{r['format']:>16} {r['shape']:>12} " + " ".join(row) + f" {r.get('best', '-'):>5} " +
              (f"{best:6.2f}x" if best is not None else f"{'-':>7}"))
    finish(t, "rows", "versions", lambda r: f"{r['format']} {r['shape']}", lambda e: f"v{e['version']}", args)


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "--quant":
        if len(sys.argv) not in (3, 4):
            sys.exit(__doc__)
        return main_quant(sys.argv[2:])
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    args = sys.argv[1:]
    t = load(read, args[0], "shapes", "BM_CudaGemv")
    if t is None:
        return
    names = sorted({e["name"] for s in t["shapes"] for e in s["variants"]}, key=lambda n: (n != "cuBLAS", n))
    print("GEMV at M = 1, bf16 weights: time (us), GB/s, share of the measured read ceiling; best; best own / cuBLAS time")
    print(f"{'N x K':>14} " + " ".join(f"{n:>22}" for n in names) + f" {'best':>7} {'own/cuBLAS':>10}")
    for s in t["shapes"]:
        row = cells(s["variants"], names, lambda e: e["name"], 22,
                    lambda e: f"{e['time_us']:8.1f} {e['GB/s']:6.0f} {100 * e['of_ceiling']:5.1f}%")
        ratio = s.get("best_own_over_cublas_time")
        print(f"{s['N']:>6} x {s['K']:<5} " + " ".join(row) + f" {s.get('best', '-'):>7} " +
              (f"{ratio:10.3f}" if ratio is not None else f"{'-':>10}"))
    finish(t, "shapes", "variants", lambda s: f"{s['N']} x {s['K']}", lambda e: e["name"], args)


if __name__ == "__main__":
    main()
