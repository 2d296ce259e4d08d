"""What agents see of a saria server: the tiny models' tokenizer and chat template, the
agent sessions of the demo and tests, WEKA sessions as a chat dataset for
`sglang.bench_serving`, and SGLang's per-tier cache report of a chat response."""
