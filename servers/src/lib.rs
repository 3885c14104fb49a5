//! Nothing to use here: this unpublished package holds the real-server tests (`tests/`), the
//! example (`examples/hyper_server.rs`) and the benchmark (`examples/hyper_bench.rs`) of
//! `tokio-wheel`'s features `hyper` and `tower`, and compiles README.md's server sample.

/// The README's code samples, the server one included, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeSamples;
