"""Which job trains which model: the training jobs are built from it, and a scoring step that
finds no trained model names the job that makes one."""

# Training job -> the model asset it (re)trains.
MODELS: dict[str, str] = {
    "fraud_training_job": "fraud_model",
    "recommendations_training_job": "recommendation_model",
}
