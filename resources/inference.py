"""The inference resource: device, precision and batch limits, and a lazy per-process model cache."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from dagster import ConfigurableResource, InitResourceContext
from pydantic import Field, PrivateAttr

from inference.device import Runtime, configure_cpu_threads, make_runtime

T = TypeVar("T")


class InferenceResource(ConfigurableResource):
    """Runs models on the best device present (CUDA when there is one, else CPU)."""

    device: str = Field(default="auto", description="auto | cpu | cuda | cuda:N | mps")
    precision: str = Field(default="auto", description="auto | fp32 | bf16 | fp16")
    max_batch_size: int = Field(default=4096, description="Rows per model call for tabular models.")
    max_batch_tokens: int = Field(
        default=16_384, description="Padded tokens per model call for text models."
    )
    cpu_threads: int | None = Field(
        default=None, description="Torch CPU threads; default all cores."
    )

    _runtime: Runtime | None = PrivateAttr(default=None)
    _models: dict[str, Any] = PrivateAttr(default_factory=dict)
    _loads: dict[str, int] = PrivateAttr(default_factory=dict)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        # Cheap on purpose: `dagster job execute` initialises resources a second time in the
        # parent process after the run, so models are loaded on first use, not here.
        self._models = {}
        self._loads = {}

    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            self._runtime = make_runtime(self.device, self.precision)
            if self._runtime.device.type == "cpu":
                configure_cpu_threads(self.cpu_threads)
        return self._runtime

    def model(self, key: str, loader: Callable[[Runtime], T]) -> T:
        """Returns the model cached under ``key``, loading it on first use in this process.

        A single-run backfill of many partitions therefore loads each model once.
        """
        if key not in self._models:
            self._models[key] = loader(self.runtime)
            self._loads[key] = self._loads.get(key, 0) + 1
        return self._models[key]

    def load_count(self, key: str) -> int:
        """How many times the model under ``key`` was loaded in this process."""
        return self._loads.get(key, 0)
