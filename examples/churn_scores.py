"""``churn_scores``: your own model as a nightly pipeline (docs/your-own-model.md)."""

import pyarrow as pa
import torch

from nightshift import Checks, Landing, Output, Predictor, nightly

ASSET, CUSTOMERS = "churn_scores", "customers"
FEATURES = ["tenure_months", "monthly_spend", "support_tickets"]
CUSTOMERS_SCHEMA = pa.schema([("customer_id", pa.string())] + [(f, pa.float64()) for f in FEATURES])
SCORES = pa.schema([("churn_probability", pa.float32())])


def churn_mlp() -> torch.nn.Module:  # the architecture the weights were trained in
    nn = torch.nn
    return nn.Sequential(nn.Linear(len(FEATURES), 16), nn.ReLU(), nn.Linear(16, 1))


class ChurnModel(Predictor):
    model_path: str  # a .safetensors file: its content hash is the model version

    def load(self, device: str) -> None:
        self.net = self.load_weights(churn_mlp(), self.model_path).to(device).eval()

    def __call__(self, batch: pa.RecordBatch) -> dict:
        x = torch.tensor([batch[f].to_pylist() for f in FEATURES]).T.float().to(self.device)
        with torch.inference_mode():
            return {"churn_probability": torch.sigmoid(self.net(x))[:, 0].cpu().numpy()}


churn = nightly(
    ASSET,
    ChurnModel,
    Landing(CUSTOMERS, CUSTOMERS_SCHEMA, key="customer_id"),
    Output(SCORES, counts={"likely_to_churn": lambda c: (c["churn_probability"] >= 0.5).sum()}),
    Checks(suite="suites/churn_scores.json"),  # beside this file
    description="Each customer's probability of cancelling, for the retention team's morning list.",
)
customers, churn_scores, defs = churn.landing_asset, churn.scoring_asset, churn.defs
