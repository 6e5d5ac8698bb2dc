"""A randomized fault campaign: seeded clients and nemesis, a history, one checker."""
