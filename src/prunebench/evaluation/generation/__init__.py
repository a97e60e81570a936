"""The `generate_until` request kind: `engine.py` (prompts -> batches -> answers -> the task's
numbers) and `greedy.py` (the model-side computation: batched greedy decoding until a stop string,
images through the model's processor)."""
