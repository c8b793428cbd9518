"""How a fraud model's manifest shows in the Dagster UI."""

from __future__ import annotations

from typing import Any

from dagster import MetadataValue

from inference.models.registry import trained_window


def model_metadata(manifest: dict[str, Any], version: str) -> dict[str, Any]:
    """Version, validation metrics, threshold, training data and the feature normalisation."""
    metrics = manifest["metrics"]
    window = trained_window(manifest)
    trained_on = manifest.get("trained_on", {})
    dates = trained_on.get("dates", [])
    rows = metrics["train_rows"] + metrics["val_rows"]
    positives = metrics["train_positives"] + metrics["val_positives"]
    rows_md = zip(manifest["features"], manifest["mean"], manifest["std"], strict=True)
    normalisation = "\n".join(f"| {name} | {mean:.4g} | {std:.4g} |" for name, mean, std in rows_md)
    return {
        "model_version": version,
        "val_auprc": metrics["val_auprc"],
        "val_roc_auc": metrics["val_roc_auc"],
        "val_precision_at_threshold": metrics["val_precision_at_threshold"],
        "val_recall_at_threshold": metrics["val_recall_at_threshold"],
        "threshold": manifest["threshold"],
        "training_rows": rows,
        "fraud_rate": round(positives / rows, 6) if rows else 0.0,
        "training_days": len(dates),
        "training_range": f"{dates[0]} .. {dates[-1]}" if dates else "",
        "trained_through": window[1] if window else "",
        "hidden_layers": MetadataValue.json(manifest["hidden"]),
        "features": MetadataValue.json(manifest["features"]),
        "normalisation": MetadataValue.md(
            "| feature | mean | std |\n|---|---|---|\n" + normalisation
        ),
    }
