"""The generic engine: requests -> tokens -> log-likelihoods -> torchmetrics, in a Lightning test loop."""
