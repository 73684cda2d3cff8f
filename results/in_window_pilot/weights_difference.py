"""Max relative difference between the pilot's float32 and float64 arms' weights (seed 0, step 400)."""

import json
import sys

import torch

RUNS = sys.argv[1] if len(sys.argv) > 1 else "runs/in-window-pilot"
a = torch.load(RUNS + "/alibi/seed0/checkpoints/last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
b = torch.load(RUNS + "/alibi_zero_free/seed0/checkpoints/last.ckpt", map_location="cpu", weights_only=False)[
    "state_dict"
]
out = {}
for k in a:
    if a[k].is_floating_point() and a[k].numel() > 1:
        x, y = a[k].double(), b[k].double()
        out[k] = (x - y).norm().item() / y.norm().item()
worst = max(out, key=out.get)
summary = {
    "command": "python results/in_window_pilot/weights_difference.py " + RUNS,
    "tensors": len(out),
    "max_relative_l2_difference": out[worst],
    "tensor": worst,
    "median_relative_l2_difference": sorted(out.values())[len(out) // 2],
}
print(json.dumps(summary, indent=2))
