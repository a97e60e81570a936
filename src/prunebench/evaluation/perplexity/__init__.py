"""The `loglikelihood_rolling` request kind over a corpus: `engine.py` (windows -> summed NLL ->
perplexity) and `windows.py` (a token stream cut into lm-eval's rolling windows; calibration and
recovery cut their text with it too)."""
