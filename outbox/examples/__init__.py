"""A demo domain (campaigns of a tabletop game) used by `make demo`, the tests and the benches."""
