"""Recovery fine-tuning after pruning (`recovery=lora|lora_llm_pruner|lora_slicegpt|distill`): its
data (`data.py`, checked before any model loads) and its training in Lightning's Trainer.fit with
the adapter merged and the pruning's zeros restored (`train.py`). docs/recovery.md."""

ADAPTER = "adapter"  # the LoRA adapter's subfolder (peft's save_pretrained), in the recovery folder and in an export
