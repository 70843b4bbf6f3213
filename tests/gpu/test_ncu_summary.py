#!/usr/bin/env python3
"""perf/gpu/ncu_summary.py on ncu --csv output written the way ncu 2025 prints it: the program's
own lines and ==PROF== lines mixed in, thousands separators, several time units, a metric to
ignore, and the optional DRAM and SM throughput percentages. Exits non-zero on the first wrong
figure."""
import subprocess
import sys
import tempfile

SUMMARY = sys.argv[1]
HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
          '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
          '"Metric Value"')


def row(i, kernel, unit, value, metric="gpu__time_duration.sum"):
    return (f'"{i}","4242","gpu_bench","127.0.0.1","{kernel}","1","13","(256, 1, 1)",'
            f'"(132, 1, 1)","0","9.0","Command line profiler metrics","{metric}","{unit}","{value}"')


LOG = "\n".join([
    "gpu_bench on NVIDIA H200",
    "==PROF== Connected to process 4242 (gpu_bench)",
    HEADER,
    row(0, "sm90_xmma_gemm_f16f16_f32", "nsecond", "1,500,000"),   # 1500 us
    row(1, "relu_forward", "usecond", "20.5"),
    row(2, "sm90_xmma_gemm_f16f16_f32", "msecond", "0.5"),          # 500 us
    row(3, "bias_add_backward", "nsecond", "79,500"),               # 79.5 us
    row(3, "bias_add_backward", "byte", "123", metric="dram__bytes.sum"),
    "==PROF== Disconnected from process 4242",
    "mptrain-model model=mlp precision=fp16 batch=8192 steps=1 samples_per_s=1.0 graphs=off",
]) + "\n"


def summarise(text, *args):
    with tempfile.NamedTemporaryFile("w", suffix=".log") as log:
        log.write(text)
        log.flush()
        return subprocess.run([sys.executable, SUMMARY, log.name, *args],
                              capture_output=True, text=True)


failures = 0
passes = 0


def expect(condition, what, output):
    global failures, passes
    if condition:
        passes += 1
        print(f"ok: {what}")
    else:
        failures += 1
        print(f"FAIL: {what}\n{output}")


done = summarise(LOG, "--label", "t", "--top", "2")
out = done.stdout
expect(done.returncode == 0, "exit 0", out + done.stderr)
expect("t: 4 kernels, 2100.0 us of GPU time per step" in out, "count and total per step", out)
lines = [line for line in out.splitlines() if line.startswith("| ")]
expect(len(lines) == 4, "header, two kernels, the rest", out)
expect(len(lines) == 4 and lines[1] == "| sm90_xmma_gemm_f16f16_f32 | 2 | 2000.0 | 95.2 % |",
       "the GEMM first: two calls, units converted, its share", out)
expect(len(lines) == 4 and lines[2] == "| bias_add_backward | 1 | 79.5 | 3.8 % |",
       "second: the other metric ignored", out)
expect(len(lines) == 4 and lines[3] == "| (1 more kernels) | | 20.5 | 1.0 % |", "the rest", out)

two = summarise(LOG, "--label", "t", "--steps", "2")
expect("t: 2 kernels, 1050.0 us of GPU time per step" in two.stdout
       and "| sm90_xmma_gemm_f16f16_f32 | 1 | 1000.0 | 95.2 % |" in two.stdout,
       "--steps 2 halves the per-step figures", two.stdout)

empty = summarise("gpu_bench: SKIPPED: no CUDA device\n", "--label", "t")
expect(empty.returncode == 1 and "t: no kernel times in" in empty.stdout,
       "no CSV: exit 1 and says so", empty.stdout + empty.stderr)

foreign = summarise('"a","b"\n"1","2"\n')
expect(foreign.returncode != 0 and "not ncu's --csv output" in foreign.stderr,
       "a CSV that is not ncu's: a one-line error", foreign.stdout + foreign.stderr)

bad_unit = summarise(HEADER + "\n" + row(0, "k", "furlong", "1") + "\n")
expect(bad_unit.returncode != 0 and "unknown time unit 'furlong'" in bad_unit.stderr,
       "an unknown unit is an error, not a guess", bad_unit.stdout + bad_unit.stderr)

# The throughput columns: each kernel's percentages weighted by its calls' times, a blank cell
# where a kernel has no figure, and no columns at all without the metrics (above).
DRAM = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
SM = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
RATES = "\n".join([
    HEADER,
    row(0, "batchnorm_apply", "usecond", "100"),
    row(0, "batchnorm_apply", "%", "80", metric=DRAM),
    row(0, "batchnorm_apply", "%", "10", metric=SM),
    row(1, "conv_fprop", "usecond", "50"),
    row(1, "conv_fprop", "%", "90", metric=DRAM),
    row(2, "batchnorm_apply", "usecond", "300"),
    row(2, "batchnorm_apply", "%", "40", metric=DRAM),
    row(2, "batchnorm_apply", "%", "30", metric=SM),
]) + "\n"
rates = summarise(RATES, "--label", "r")
rate_lines = [line for line in rates.stdout.splitlines() if line.startswith("| ")]
expect(rates.returncode == 0 and "r: 3 kernels, 450.0 us of GPU time per step" in rates.stdout,
       "percent rows are not launches of their own", rates.stdout + rates.stderr)
expect(len(rate_lines) == 3 and rate_lines[0] == "| kernel | calls/step | us/step | share | DRAM % | SM % |",
       "a column per throughput metric", rates.stdout)
expect(len(rate_lines) == 3 and rate_lines[1] == "| batchnorm_apply | 2 | 400.0 | 88.9 % | 50 | 25 |",
       "percentages weighted by time: (80*100 + 40*300) / 400, (10*100 + 30*300) / 400", rates.stdout)
expect(len(rate_lines) == 3 and rate_lines[2] == "| conv_fprop | 1 | 50.0 | 11.1 % | 90 | |",
       "a kernel without an SM figure gets a blank cell", rates.stdout)

bad_percent = summarise(HEADER + "\n" + row(0, "k", "usecond", "1") + "\n"
                        + row(0, "k", "byte", "7", metric=DRAM) + "\n")
expect(bad_percent.returncode != 0 and "not '%'" in bad_percent.stderr,
       "a throughput metric not in percent is an error", bad_percent.stdout + bad_percent.stderr)

print(f"{passes} passed, {failures} failed")
sys.exit(1 if failures else 0)
