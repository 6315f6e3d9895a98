//! The OpenAI-compatible backend against a real third-party server on
//! loopback: llama-cpp-python's `python -m llama_cpp.server` or llama.cpp's
//! `llama-server`, serving any GGUF under the alias `local`.
//!
//! Ignored by default (a server build takes minutes). To run:
//!
//! ```sh
//! python -m llama_cpp.server --model MODEL.gguf --port 8080 --model_alias local &
//! FANFOLD_REAL_SERVER_URL=http://127.0.0.1:8080/v1 \
//!   cargo nextest run -p fanfold-http --test real_server --run-ignored only
//! ```

// A failed step should fail the test loudly, right there.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod support;

use fanfold_http::{EndpointConfig, OpenAiBackend, OpenAiConfig, OutputMode};
use fanfold_model::ModelBackend;
use serde_json::Value;
use support::{numbered, outcomes};

fn server() -> (String, String) {
    let url = std::env::var("FANFOLD_REAL_SERVER_URL")
        .expect("set FANFOLD_REAL_SERVER_URL to the server's /v1 root");
    let model = std::env::var("FANFOLD_REAL_SERVER_MODEL").unwrap_or_else(|_| "local".into());
    (url, model)
}

fn run(stream: bool) {
    let (url, model) = server();
    let mut endpoint = EndpointConfig::new(url);
    endpoint.max_concurrency = 2;
    let mut cfg = OpenAiConfig::new(model, vec![endpoint]);
    cfg.output = OutputMode::JsonObject;
    cfg.stream = stream;
    let backend = OpenAiBackend::new(cfg).expect("backend");
    let job = numbered(4, 2);
    backend.run(&job).expect("run");
    let outcomes = outcomes(&job);
    assert_eq!(outcomes.len(), 4);
    for (unit, result) in outcomes {
        let c = result.unwrap_or_else(|e| panic!("{unit}: {e}"));
        // The server's grammar held the answer to the job's schema.
        let v: Value =
            serde_json::from_str(&c.text).unwrap_or_else(|e| panic!("{unit}: {e}: {:?}", c.text));
        assert!(v["unit"].is_string(), "{unit}: {v}");
        assert!(c.usage.latency_ms > 0, "{unit}");
        let prompt = c.usage.prompt_tokens + c.usage.cached_tokens;
        if stream {
            // llama-cpp-python 0.3.36 ignores `stream_options.include_usage`
            // and streams no usage; then nothing is counted, never a guess.
            assert_eq!(prompt == 0, c.usage.completion_tokens == 0, "{unit}");
        } else {
            assert!(prompt > 0 && c.usage.completion_tokens > 0, "{unit}");
        }
    }
    let stats = backend.stats();
    assert_eq!((stats.succeeded, stats.failed), (4, 0));
}

#[test]
#[ignore = "needs a real OpenAI-compatible server: FANFOLD_REAL_SERVER_URL"]
fn real_server_answers_structured_output_with_usage() {
    run(false);
}

#[test]
#[ignore = "needs a real OpenAI-compatible server: FANFOLD_REAL_SERVER_URL"]
fn real_server_streams_structured_output_with_usage() {
    run(true);
}
