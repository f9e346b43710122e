"""Fixtures the memory techniques' exactness tests share: the tiny LoRA Llama and its plain
step (the loss and gradients every technique must give exactly). Imported lazily: the other
test files here need neither transformers nor peft."""
import pytest


@pytest.fixture(scope="module")
def lora_model():
    from tests.memory_helpers import tiny_lora_llama

    return tiny_lora_llama(layers=4)


@pytest.fixture(scope="module")
def baseline(lora_model):
    from tests.memory_helpers import batch, step

    return step(lora_model, batch())
