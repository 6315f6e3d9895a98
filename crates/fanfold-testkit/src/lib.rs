//! Test doubles, kept once for every crate's tests and for `bench http`:
//! [`Server`] serves an axum app (a mock provider) on loopback from its own
//! runtime, and [`QueueJob`] is the engine's side of a [`Job`] reduced to a
//! queue, the results and the measurements a test checks a backend by;
//! [`wire`] reads fanfold's requests as a mock provider sees them;
//! [`tracker`] serves an issue export and its comments as GitHub's REST
//! API does, for `fanfold fixture serve` and `bench tools`; [`Postgres`] is
//! a throwaway PostgreSQL server.
//!
//! Nothing here panics on its own: a test decides what is a failure, so
//! checks return what they found.

mod job;
mod postgres;
mod server;
pub mod tracker;
pub mod wire;

pub use job::{Finished, QueueJob};
pub use postgres::Postgres;
pub use server::{Server, THREAD_NAME};
