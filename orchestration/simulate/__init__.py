"""``nightshift simulate``: spot/on-demand capacity policies replayed over real spot traces.

- ``traces``: reading a trace file, the real traces' checked cache, cutting nights.
- ``replay``: one night under an online policy (the policies production has or will have).
- ``optimum``: the cheapest schedule that meets the deadline, knowing the trace.
- ``sweep``: every policy over every night and setting, summed into records.
- ``cli``: the subcommand.
"""
