"""One engine per request kind (registry.py): requests -> model responses -> the task's
process_results -> torchmetrics, in a Lightning test loop."""
