#!/usr/bin/env bash
# perf/compare_pytorch.sh (issue #10): every bad option is a one-line error with exit 2 before
# anything runs. With python3-torch installed, a tiny run on synthetic data prints one row per
# model x precision x ranks, in order, whose ratio, GFLOP/s and GEMM share follow from its own
# medians, FLOPs and GEMM table.
source "$(dirname "$0")/common.sh"
SCRIPT="$(cd "$(dirname "$0")/../.." && pwd)/perf/compare_pytorch.sh"
PY=/usr/bin/python3

expect_error() {  # MESSAGE ARGS...: exit 2 with MESSAGE on stderr
  local want=$1 rc=0
  shift
  bash "$SCRIPT" --mptrain "$MPTRAIN" "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
  if [[ $rc -eq 2 ]] && grep -qF -- "$want" "$TMP/err"; then
    pass "$* -> $want"
  else
    fail "$*: want exit 2 and '$want', got $rc: $(head -c 300 "$TMP/err")"
  fi
}
expect_error "--models: unknown model 'vgg'" -m "mlp vgg"
expect_error "--models is empty" -m " "
expect_error "--precisions: unknown precision 'fp16'" -p "fp32 fp16"
expect_error "--steps: bad entry 'cnn:fp16=3'" -s "cnn:fp16=3"
expect_error "--steps: bad entry 'mlp=0'" -s "mlp=0"
expect_error "--steps: bad entry 'vgg=5'" -s "300 vgg=5"
expect_error "'0' is not a positive integer" -n "1 0"
expect_error "'x' is not a positive integer" -t "1 x"
expect_error "--warmup must be an integer >= 0" -w -1
expect_error "-r needs a value" -r
expect_error "unknown option '--bogus'" --bogus
expect_error "config '$TMP/none.ini' not found" -c "$TMP/none.ini"
expect_error "--data: no $TMP/train.h5" -d "$TMP"
expect_error "--gemm-bench: $TMP/none not found" --gemm-bench "$TMP/none"
if bash "$SCRIPT" --help | grep -q -- "--precisions"; then pass "--help"; else fail "--help"; fi

if ! "$PY" -c 'import torch, h5py' 2>/dev/null; then
  echo "skip: $PY cannot import torch and h5py; no end-to-end comparison"
  finish
  exit
fi

"$MPTRAIN" prepare synthetic --out "$TMP/data" --train-samples 256 --test-samples 32 \
  --shape 1,28,28 --classes 10 --seed 3 >"$TMP/prepare.log"
GEMM=$(dirname "$MPTRAIN")/perf/bench_kernels
[[ -x "$GEMM" ]] || GEMM=none
# Two repetitions, so that each framework also goes first once.
if bash "$SCRIPT" --mptrain "$MPTRAIN" --gemm-bench "$GEMM" -d "$TMP/data" -m "mlp cnn" \
    -p "fp32 bf16" -n "1 2" -t 1 -b 8 -r 2 -s "2 cnn=1" -o "$TMP/table.md" \
    >"$TMP/run.out" 2>"$TMP/run.err"; then
  pass "tiny comparison ran: $(tail -n 1 "$TMP/run.err")"
else
  fail "tiny comparison"; tail -n 30 "$TMP/run.err" >&2
fi
if grep -c 'pytorch \+[0-9]\+ samples/s' "$TMP/run.err" | grep -qx 16 &&
    [[ $(grep -c 'mptrain \+[0-9]\+ samples/s' "$TMP/run.err") -eq 16 ]]; then
  pass "16 runs of each framework"
else
  fail "want 16 runs of each framework"; cat "$TMP/run.err" >&2
fi
if cmp -s "$TMP/run.out" "$TMP/table.md"; then pass "--out holds the printed tables"; else fail "--out"; fi

if "$PY" - "$TMP/table.md" "$GEMM" "$(env -u OMP_NUM_THREADS nproc)" <<'PY'; then pass "table rows agree with their own figures"; else fail "table"; fi
import re, sys
text, gemm, machine = open(sys.argv[1]).read(), sys.argv[2] != "none", int(sys.argv[3])
num = lambda s: float(s.replace(",", ""))
rows = [line.split("|")[1:-1] for line in text.splitlines()
        if re.match(r"\| (mlp|cnn) \|", line)]
keys = [(r[0].strip(), r[1].strip(), r[2].strip()) for r in rows]
assert keys == [(m, p, f"{k} \u00d7 1") for k in (1, 2) for m in ("mlp", "cnn")
                for p in ("fp32", "bf16")], keys
flops = {m: float(v) * 1e6 for m, v in re.findall(r"(mlp|cnn) ([0-9.]+) M", text)}
assert set(flops) == {"mlp", "cnn"} and all(v > 0 for v in flops.values()), flops
best = re.search(r"Best single-core GEMM in this run: ([0-9.]+) GFLOP/s", text)
assert bool(best) == gemm, "GEMM table present iff --gemm-bench ran"
best_bf16 = re.search(r"bf16 operands: ([0-9.]+) GFLOP/s", text)
if gemm:
    # Columns by library; "oneDNN bf16" (where the host takes bf16) is the bf16 rows' ceiling.
    table = text.split("| GEMM |")[1]
    libs = [c.strip() for c in table.splitlines()[0].split("|")[:-1]]
    rates = {lib: [] for lib in libs}
    for line in table.splitlines()[2:]:
        if not line.startswith("| "):
            break
        for lib, cell in zip(libs, line.split("|")[2:-1]):
            if re.match(r"\s*[0-9.]+ \[", cell):
                rates[lib].append(float(cell.split()[0]))
    f32 = [v for lib, vs in rates.items() if not lib.endswith(" bf16") for v in vs]
    bf16 = [v for lib, vs in rates.items() if lib.endswith(" bf16") for v in vs]
    assert len(f32) >= 2 and max(f32) == float(best[1]) > 0, (rates, best[1])
    assert bool(bf16) == bool(best_bf16), (rates, best_bf16)
    if bf16:
        assert max(bf16) == float(best_bf16[1]) > 0, (rates, best_bf16[1])
for r, (model, precision, layout) in zip(rows, keys):
    m, p = (num(re.match(r"\s*([0-9,]+) \[", c)[1]) for c in (r[3], r[4]))
    assert m > 0 and p > 0, r
    # The cells show rounded medians: allow their rounding, and the printed figure's.
    assert abs(num(r[5]) - m / p) <= 0.006 + m / p * (0.5 / m + 0.5 / p), ("ratio", r)
    cores = min(int(layout.split()[0]), machine)  # 1 thread per rank
    rate = 3 * flops[model] * m / 1e9 / cores
    assert abs(num(r[6]) - rate) <= 0.06 + rate * (0.5 / m + 0.002), ("GFLOP/s", r, rate)
    if gemm:
        ceiling = float((best_bf16 if precision == "bf16" and best_bf16 else best)[1])
        assert abs(num(r[7].replace("%", "")) - 100 * num(r[6]) / ceiling) <= 1.5, r
    else:
        assert r[7].strip() == "\u2013", r
PY
finish
