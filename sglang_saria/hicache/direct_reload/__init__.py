"""The direct reload's SGLang glue (`SariaRadixCache`'s reload path): built over the pools, probed,
held, followed, reported, and staged in SGLang's memory plan; the machinery itself is `reload/` (../README.md)."""
