"""Test setup: the real-service fixtures (Slurm cluster, MLflow server) live in tests/infra/."""

pytest_plugins = ["tests.infra.slurm_fixture", "tests.infra.mlflow_fixture"]
