"""The segment store: containers, the durable log, Tier-1 logs, the read index."""
