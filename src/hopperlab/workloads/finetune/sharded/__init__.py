"""finetune's ``sharded`` engine: full fine-tuning of our own Llama (``llama.py``) sharded by
FSDP2 or torchao's CPU offload (``engine.py``)."""
