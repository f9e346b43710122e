"""finetune's ``mcore`` engine (alias ``nemo``): megatron-core's GPT with LoRA in a child process
(``engine.py`` starts ``runner.py``), so the job's process never imports megatron."""
