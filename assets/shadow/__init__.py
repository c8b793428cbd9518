"""Shadow scoring: a model's challenger scores each night beside the champion, into
``outputs/<asset>_shadow/``, and each day records how far the two agree
(``inference/models/agreement.py``); the promotion gate can require the last N of those nights
to be clean (nights.py). asset.py makes the Dagster asset; each gated domain declares its shadow
in its wiring."""
