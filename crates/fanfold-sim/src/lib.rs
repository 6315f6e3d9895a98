//! Simulated model backends, for tests, `fanfold selfcheck` and replays:
//! `scripted` answers with a jq program and injects faults; `replay`
//! answers from a cassette that `RecordingBackend` writes from a real run.
//! Both report `simulated: true`, and every output they touch says
//! [SIMULATED].

pub mod replay;
pub mod scripted;

pub use replay::{Cassette, CassetteEntry, RecordingBackend, ReplayBackend};
pub use scripted::ScriptedBackend;
