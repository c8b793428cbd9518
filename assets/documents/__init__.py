"""The documents dataset: the day's articles as the content systems land them, with their
landing asset, schema, screening, gate, suite and demo data. Two domains read it, the summaries
and the embeddings, and both import it from here. The summaries' wiring registers its asset and
its demo day, as it always has (the summaries' nightly job is the first to land it)."""
