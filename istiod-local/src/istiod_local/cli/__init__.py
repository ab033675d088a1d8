"""`istiod-local`'s command line: `serve` and its helpers (`main.py`), `up` (`up.py`)."""
