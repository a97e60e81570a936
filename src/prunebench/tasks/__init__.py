"""Tasks are data: documents -> typed requests (api/requests.py) -> process_results per document.
They import nothing of evaluation/; the engine of a task's request kind runs it."""
