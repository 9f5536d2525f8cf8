"""A demo domain (campaigns of a tabletop game): `make demo` runs it (`demo`), and the tests and
benches use its projectors (`app`, `outbox-worker --app campaigns_demo.app:app` with
`docs/examples` on the path) and its event stream (`campaigns`). Not part of the package."""
