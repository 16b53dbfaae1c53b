#!/usr/bin/env bash
# Direct-prompting baselines on BFCL (issue 2). Usage: scripts/baselines.sh MODEL SELECT_LIMIT FINAL_LIMIT [STYLES...]
# Runs every style on SELECT_LIMIT cases per category, keeps the style with the best mean category
# accuracy, and extends that run to FINAL_LIMIT cases per category (the run resumes, nothing is redone).
set -euo pipefail
model=$1 select_limit=$2 final_limit=$3; shift 3
styles=("$@"); [ ${#styles[@]} -gt 0 ] || styles=(bfcl native)
cats="simple_python multiple parallel parallel_multiple irrelevance live_simple live_multiple"
for style in ${styles[@]}; do
  hyfunc eval bfcl --method direct --model "$model" --style "$style" --categories $cats \
    --limit "$select_limit" --out "reports/baseline/$model-$style"
done
best=$(python - "$model" ${styles[@]} <<'PY'
import json, sys
model, styles = sys.argv[1], sys.argv[2:]
score = lambda s: json.load(open(f"reports/baseline/{model}-{s}/results.json"))["category_mean_accuracy"]
print(max(styles, key=score))
PY
)
echo "best style for $model: $best"
hyfunc eval bfcl --method direct --model "$model" --style "$best" --categories $cats \
  --limit "$final_limit" --out "reports/baseline/$model-$best"
