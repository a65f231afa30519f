"""A tiny training step: fit a one-feature linear model to a CSV, log it with MLflow, save the model.

Run it here (`python train.py`) or on a machine from the Compute panel:
the files it writes (model.pkl, metrics.json) come back into this folder.
"""

import csv
import json
import pickle
import sys

import mlflow

data_path = sys.argv[1] if len(sys.argv) > 1 else "data/points.csv"
with open(data_path, newline="") as f:
    rows = [(float(r["x"]), float(r["y"])) for r in csv.DictReader(f)]

# Ordinary least squares for y = a*x + b, written out so the example needs nothing but MLflow.
n = len(rows)
mean_x = sum(x for x, _ in rows) / n
mean_y = sum(y for _, y in rows) / n
a = sum((x - mean_x) * (y - mean_y) for x, y in rows) / sum((x - mean_x) ** 2 for x, _ in rows)
b = mean_y - a * mean_x
mse = sum((a * x + b - y) ** 2 for x, y in rows) / n

with mlflow.start_run():
    mlflow.set_tag("model", "ols")
    mlflow.log_param("rows", n)
    for step, (x, y) in enumerate(rows):
        mlflow.log_metric("residual", abs(a * x + b - y), step=step)
    mlflow.log_metric("mse", mse)

    with open("model.pkl", "wb") as f:
        pickle.dump({"a": a, "b": b}, f)
    with open("metrics.json", "w") as f:
        json.dump({"mse": mse, "rows": n}, f)
    mlflow.log_artifact("metrics.json")
print(f"trained on {n} rows: y = {a:.3f}x + {b:.3f}, mse {mse:.4f}")
