//! tokio-wheel: an async, Tokio-native hierarchical timer wheel.
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms
)]
#![doc(test(attr(deny(warnings))))]

mod error;
pub mod wheel;

pub use error::BuildError;
pub use wheel::Layout;
