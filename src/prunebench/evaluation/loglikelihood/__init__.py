"""The `loglikelihood` request kind: `engine.py` (documents -> requests -> batches -> the task's
numbers, in a Lightning test loop), `scorer.py` (the model-side computation: continuations'
log-likelihoods, shared contexts and stems once), `lm_eval_numerics.py` (`eval.numerics=lm_eval`:
lm-eval's own computation, one request at a time)."""
