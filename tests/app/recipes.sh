#!/usr/bin/env bash
# The committed accuracy recipes (inputs/fashion-mnist-*.ini, docs/perf.md) still parse, build
# their model and train: each runs 2 steps on 2 ranks in fp32 and fp16 on the real data, with
# its model printed. The accuracy runs themselves take minutes each and are not run here.
# RECIPES_DIR=DIR checks the fashion-mnist-*.ini files of DIR instead (to see it fail).
source "$(dirname "$0")/common.sh"
FMNIST=${FMNIST_SOURCE:-/usr/share/datasets/fashion-mnist}
INPUTS=${RECIPES_DIR:-$(cd "$(dirname "$0")/../../inputs" && pwd)}

"$MPTRAIN" prepare fashion-mnist --source "$FMNIST" --out "$TMP/fm" >/dev/null
recipes=("$INPUTS"/fashion-mnist-*.ini)
[ "${#recipes[@]}" -ge 2 ] && pass "found ${#recipes[@]} recipes" || fail "no recipes in $INPUTS"
for recipe in "${recipes[@]}"; do
  name=$(basename "$recipe" .ini)
  for precision in fp32 fp16; do
    out="$TMP/$name-$precision"
    # The data paths are the quickstart's; warmup is overridden because 2 steps are shorter
    # than any recipe's warmup (which the trainer rightly rejects); no test set, no checkpoint.
    if timeout 300 "$MPIEXEC" -n 2 --oversubscribe "$MPTRAIN" train --config "$recipe" \
      --data.train="$TMP/fm/train.h5" --data.test= --train.max-steps=2 \
      --schedule.warmup-steps=0 --train.precision=$precision --model.print \
      --output.dir="$out" --checkpoint.dir= >"$out.log" 2>&1; then
      python3 - "$out/summary.json" "$precision" <<'PYEOF' && pass "$name $precision: 2 steps" ||
import json, math, sys
s = json.load(open(sys.argv[1]))
assert s["steps"] == 2 and s["precision"] == sys.argv[2], s
assert math.isfinite(s["final_train_loss"]), s
PYEOF
        { fail "$name $precision: summary"; cat "$out/summary.json" >&2; }
      # --model.print lists the layers with their parameter counts and the total.
      grep -q "total" "$out.log" && pass "$name $precision: model printed" ||
        { fail "$name $precision: no model summary"; cat "$out.log" >&2; }
    else
      fail "$name $precision: train"
      tail -n 20 "$out.log" >&2
    fi
  done
done
finish
