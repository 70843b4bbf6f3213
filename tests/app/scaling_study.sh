#!/usr/bin/env bash
# The scaling-study driver (issue #9, perf/scaling_study.py) end to end on 1, 2 and 4 ranks, weak
# and strong, on emulated nodes of 2 ranks: scaling.csv has one row per mode x rank count whose
# numbers agree with the runs' own metrics.jsonl, scaling.md carries the tables and the command,
# the PNGs are real images; a global batch that does not divide, a failing run, srun inside a
# Slurm allocation (a stand-in) and --collect-only over a job array's folders behave as documented.
source "$(dirname "$0")/common.sh"
PY=/usr/bin/python3  # Debian's python3 has matplotlib
DRIVER="$(cd "$(dirname "$0")/../.." && pwd)/perf/scaling_study.py"
D="$TMP/data"
"$MPTRAIN" prepare synthetic --out "$D" --train-samples 1024 --test-samples 64 --shape 1,28,28 \
  --classes 10 --seed 5 >"$TMP/prepare.log"
COMMON=(--mptrain "$MPTRAIN" --mpiexec "$MPIEXEC" --launcher mpirun)
TRAIN=(-- --data.train="$D/train.h5" "--model.layers=dense:64,relu,dense:10")
OUT="$TMP/study"

if $PY "$DRIVER" "${COMMON[@]}" --ranks 1,2,4 --mode both --batch-per-rank 16 --global-batch 64 \
    --steps 24 --log-every 4 --ranks-per-node 2 --repeats 2 --out "$OUT" "${TRAIN[@]}" \
    >"$TMP/driver.log" 2>&1; then
  pass "driver ran 12 runs: $(tail -1 "$TMP/driver.log")"
else
  fail "driver on 1, 2, 4 ranks"; cat "$TMP/driver.log" >&2
fi

# check_csv CSV RUNS REPEATS_N4: rows, columns, shapes, positive numbers, efficiency against the
# smallest rank count, and each throughput recomputed from the runs' metrics.jsonl windows.
check_csv() {
  $PY - "$@" <<'PY'
import csv, glob, json, math, os, statistics, sys
path, runs, repeats_n4 = sys.argv[1], sys.argv[2], int(sys.argv[3])
columns = ["mode", "ranks", "nodes", "batch_per_rank", "global_batch", "samples_per_s",
           "samples_per_s_per_rank", "efficiency", "step_ms", "data_wait_ms", "forward_ms",
           "backward_ms", "comm_ms", "exposed_comm_ms", "optimizer_ms", "other_ms", "repeats",
           "samples_per_s_min", "samples_per_s_max", "spread", "measured"]
with open(path) as f:
    reader = csv.DictReader(f)
    assert reader.fieldnames == columns, reader.fieldnames
    rows = list(reader)
assert [(r["mode"], int(r["ranks"])) for r in rows] == \
    [(m, n) for m in ("weak", "strong") for n in (1, 2, 4)], [(r["mode"], r["ranks"]) for r in rows]
base = {}
for r in rows:
    n = int(r["ranks"])
    v = {k: float(r[k]) for k in columns if k not in ("mode", "measured", "nodes")}
    assert int(r["nodes"]) == math.ceil(n / 2), r
    shape = (16, 16 * n) if r["mode"] == "weak" else (64 // n, 64)
    assert (v["batch_per_rank"], v["global_batch"]) == shape, r
    for k in ["samples_per_s", "samples_per_s_per_rank", "efficiency", "step_ms", "forward_ms",
              "backward_ms", "optimizer_ms", "samples_per_s_min", "samples_per_s_max"]:
        assert v[k] > 0, (k, r)
    if n > 1:
        assert v["comm_ms"] > 0 and v["exposed_comm_ms"] > 0, r
    assert v["repeats"] == (repeats_n4 if n == 4 else 2), r
    assert v["samples_per_s_min"] <= v["samples_per_s"] <= v["samples_per_s_max"], r
    assert math.isclose(v["samples_per_s_per_rank"] * n, v["samples_per_s"], rel_tol=1e-4), r
    base.setdefault(r["mode"], (n, v["samples_per_s"]))
    n0, t0 = base[r["mode"]]
    want = 1.0 if n == n0 else v["samples_per_s"] / (n / n0 * t0)
    assert math.isclose(v["efficiency"], want, rel_tol=1e-4), (r, want)
    # Independent of the driver: windows after the first, median over this shape's runs.
    rates = []
    for metrics in glob.glob(os.path.join(runs, "*", "metrics.jsonl")):
        mode = os.path.basename(os.path.dirname(metrics)).split("-")[0]
        if mode in ("weak", "strong") and mode != r["mode"]:
            continue  # the driver's own folders name the mode; an array's do not
        summary = json.load(open(os.path.join(os.path.dirname(metrics), "summary.json")))
        if (summary["world_size"], summary["global_batch"]) != (n, v["global_batch"]):
            continue
        windows = [w for w in map(json.loads, open(metrics)) if "window_s" in w][1:]
        rates.append(sum(w["window_steps"] for w in windows) * summary["global_batch"] /
                     sum(w["window_s"] for w in windows))
    assert len(rates) == v["repeats"], (r, rates)
    assert math.isclose(statistics.median(rates), v["samples_per_s"], rel_tol=1e-4), (r, rates)
print(f"{len(rows)} rows; efficiency " +
      ", ".join(f"{r['mode']} {r['ranks']}: {float(r['efficiency']):.2f}" for r in rows))
PY
}

if result=$(check_csv "$OUT/scaling.csv" "$OUT/runs" 2 2>&1); then
  pass "scaling.csv: $result"
else
  fail "scaling.csv"; echo "$result" >&2; cat "$OUT/scaling.csv" >&2
fi

md="$OUT/scaling.md"
if [ -f "$md" ] && grep -q '^perf/scaling_study.py .*--ranks 1,2,4 ' "$md" &&
    grep -q '^## Weak scaling' "$md" && grep -q '^## Strong scaling' "$md" &&
    grep -q '^| ranks | nodes | batch/rank | global batch | samples/s' "$md" &&
    [ "$(grep -cE '^\| [124] \| [12] \| [0-9]+ \| [0-9]+ \| [0-9]+ \[' "$md")" -eq 6 ] &&
    grep -q '^| 1 | 1 | 16 | 16 | .* | 1.00 |' "$md"; then
  pass "scaling.md: the command line and two tables of 3 rows"
else
  fail "scaling.md"; cat "$md" >&2
fi

# check_png FILE...: the PNG signature, a non-trivial size, and matplotlib can read it back.
if result=$($PY - "$OUT/throughput.png" "$OUT/efficiency.png" <<'PY' 2>&1
import os, sys
import matplotlib.image
for path in sys.argv[1:]:
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n", path
    assert os.path.getsize(path) > 10000, (path, os.path.getsize(path))
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 300 and image.shape[1] > 400, (path, image.shape)
    assert image.std() > 0.01, path  # not a blank canvas
print(", ".join(f"{os.path.basename(p)} {os.path.getsize(p)} bytes" for p in sys.argv[1:]))
PY
); then
  pass "PNGs: $result"
else
  fail "PNGs"; echo "$result" >&2
fi

# A global batch that 4 ranks cannot share: a one-line error, exit 2, before any run.
rc=0
$PY "$DRIVER" "${COMMON[@]}" --ranks 1,2,4 --mode strong --global-batch 90 --steps 8 \
  --out "$TMP/bad" "${TRAIN[@]}" >"$TMP/bad.log" 2>&1 || rc=$?
if [ "$rc" -eq 2 ] && [ "$(wc -l <"$TMP/bad.log")" -eq 1 ] &&
    grep -q "error: --global-batch 90 does not divide by 4 rank(s)" "$TMP/bad.log" &&
    [ ! -d "$TMP/bad/runs" ]; then
  pass "bad --global-batch: $(cat "$TMP/bad.log")"
else
  fail "bad --global-batch: exit $rc"; cat "$TMP/bad.log" >&2
fi

# A run that fails: the driver stops, names the run and its log, exits non-zero.
rc=0
$PY "$DRIVER" "${COMMON[@]}" --ranks 1,2 --mode weak --steps 8 --out "$TMP/fails" \
  -- --data.train="$TMP/missing.h5" >"$TMP/fails.log" 2>&1 || rc=$?
log="$TMP/fails/runs/weak-n1-r1/train.log"
if [ "$rc" -ne 0 ] &&
    grep -q "error: run weak-n1-r1 failed (exit 2): .*missing.h5.*; log: $log" "$TMP/fails.log" &&
    [ -f "$log" ] && [ ! -d "$TMP/fails/runs/weak-n2-r1" ]; then
  pass "failing run: exit $rc, names weak-n1-r1 and its log"
else
  fail "failing run: exit $rc"; cat "$TMP/fails.log" >&2
fi

# Inside a Slurm allocation (SLURM_JOB_ID set, srun on PATH) --launcher auto runs `srun -n N`; a
# stand-in srun hands the job to mpiexec.
mkdir -p "$TMP/bin"
cat >"$TMP/bin/srun" <<STANDIN
#!/usr/bin/env bash
[ "\$1" = -n ] || { echo "srun stand-in: expected -n N, got \$*" >&2; exit 9; }
n=\$2; shift 2
exec "$MPIEXEC" -n "\$n" --oversubscribe "\$@"
STANDIN
chmod +x "$TMP/bin/srun"
if PATH="$TMP/bin:$PATH" SLURM_JOB_ID=1 $PY "$DRIVER" --mptrain "$MPTRAIN" --ranks 1,2 --mode weak \
      --batch-per-rank 8 --steps 8 --log-every 2 --out "$TMP/slurm" "${TRAIN[@]}" >"$TMP/slurm.log" 2>&1 &&
    head -1 "$TMP/slurm/runs/weak-n2-r1/train.log" | grep -q "^# srun -n 2 $MPTRAIN train " &&
    [ "$(grep -c '^weak,' "$TMP/slurm/scaling.csv")" -eq 2 ]; then
  pass "--launcher auto in a Slurm allocation: $(head -1 "$TMP/slurm/runs/weak-n2-r1/train.log" | cut -c1-30)..."
else
  fail "srun launcher"; cat "$TMP/slurm.log" >&2; head -2 "$TMP/slurm/runs/"*/train.log >&2
fi

# --collect-only over a job array's folders (runs/sweep-<i>/, names without a mode): the modes
# come from the shapes; the 4-rank runs (16 per rank, 64 global) belong to both series.
i=0
for run in "$OUT"/runs/*/; do
  i=$((i + 1)); mkdir -p "$TMP/array/runs"; cp -r "$run" "$TMP/array/runs/sweep-$i"
done
if $PY "$DRIVER" --collect-only "$TMP/array/runs" --ranks-per-node 2 --out "$TMP/collected" \
      >"$TMP/collect.log" 2>&1 &&
    result=$(check_csv "$TMP/collected/scaling.csv" "$TMP/array/runs" 4 2>&1); then
  pass "--collect-only of $i array runs: $result"
else
  fail "--collect-only"; cat "$TMP/collect.log" >&2; echo "$result" >&2
fi

finish
