"""nightshift's public API: your own model as a nightly batch-inference pipeline, in one import.

    from nightshift import Checks, Landing, Output, Predictor, nightly

See docs/your-own-model.md and examples/churn_scores.py.
"""

from nightshift.pipeline import Checks, Landing, Output, Predictor, nightly

__all__ = ["Checks", "Landing", "Output", "Predictor", "nightly"]
