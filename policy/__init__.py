"""Policy every layer above shares, in one leaf package that imports nothing of nightshift.

``assets/`` declares its assets with it, ``resources/`` takes its defaults from it, and
``orchestration/`` assembles jobs, schedules and sensors from it:

- ``partitions``: the daily partitions, the start date, the backfill policy, key validation.
- ``automation``: the GPU pool, the freshness deadline, when downstream assets run by themselves.
- ``tags``: every run tag nightshift sets or reads, and the run priorities.
- ``retries``: the two retry budgets (errors in user code, interruptions).
- ``capacity``: the run tags that move an often-interrupted run to on-demand capacity.
- ``deadline``, ``ready_by``: the deadline-aware choice of spot or on-demand, and each asset's
  ready-by time.
- ``prices``: node prices per hour (``prices.json``), for the cost ledger and the simulator.

Which job trains which model is each domain's (``assets/<domain>/__init__.py``).
"""
