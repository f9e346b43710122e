"""finetune's ``torch`` engine: transformers + peft in the job's process, every memory technique
of ``hopperlab.memory`` (``techniques.py``). Cheap to import: the modules import torch inside."""
