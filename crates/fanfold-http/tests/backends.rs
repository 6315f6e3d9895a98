//! The HTTP backends against an in-process provider with injected faults.
//!
//! Nothing here asserts an upper bound on elapsed time. Rate tests count
//! requests inside windows (an upper bound the limiter guarantees however
//! slow the machine is) or check that a hold lasted at least as long as
//! the provider asked.

// A failed step should fail the test loudly, right there.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeSet;
use std::sync::LazyLock;
use std::time::Duration;

use fanfold_http::{
    AnthropicBackend, AnthropicConfig, BreakerConfig, EndpointConfig, HttpError, OpenAiBackend,
    OpenAiConfig, OutputMode, RetryConfig, TransportConfig,
};
use fanfold_model::{CallError, ModelBackend};
use serde_json::{Value, json};
use support::{Action, DropServer, Mock, job, job_schema, numbered, outcomes};

/// A unique key in a unique environment variable, set once before any
/// test reads the environment.
static KEY: LazyLock<(String, String)> = LazyLock::new(|| {
    let value = format!(
        "sk-test-{:016x}{:016x}",
        fastrand::u64(..),
        fastrand::u64(..)
    );
    let var = format!("FANFOLD_HTTP_TEST_KEY_{}", std::process::id());
    // SAFETY: every test calls `key()` first, so all test threads either
    // run this or wait for it to finish; none reads the environment while
    // it is written, and nothing else in the process writes it.
    unsafe { std::env::set_var(&var, &value) };
    (var, value)
});

fn key() -> (&'static str, &'static str) {
    (KEY.0.as_str(), KEY.1.as_str())
}

fn endpoint(url: String, concurrency: usize) -> EndpointConfig {
    EndpointConfig {
        api_key_env: Some(key().0.to_owned()),
        max_concurrency: concurrency,
        ..EndpointConfig::new(url)
    }
}

/// Fast backoff, no breaker unless a test sets one.
fn transport(endpoints: Vec<EndpointConfig>) -> TransportConfig {
    TransportConfig {
        request_timeout_ms: 2_000,
        connect_timeout_ms: 1_000,
        retry: RetryConfig {
            max_retries: 2,
            backoff_base_ms: 5,
            backoff_max_ms: 20,
            max_retry_after_ms: 5_000,
        },
        breaker: BreakerConfig {
            failure_threshold: 1_000,
            cooldown_ms: 60_000,
        },
        ..TransportConfig::new(endpoints)
    }
}

fn openai(endpoints: Vec<EndpointConfig>) -> OpenAiConfig {
    OpenAiConfig {
        seed: Some(7),
        transport: transport(endpoints),
        ..OpenAiConfig::new("test-model", Vec::new())
    }
}

fn answer(unit: &str) -> String {
    json!({"unit": unit}).to_string()
}

#[test]
fn openai_sends_schema_warms_the_prefix_and_reads_cached_usage() {
    let (_, secret) = key();
    let mock = Mock::start();
    let backend =
        OpenAiBackend::new(openai(vec![endpoint(mock.openai_url(), 4)])).expect("backend");
    let job = numbered(6, 3);
    backend.run(&job).expect("run");
    let out = outcomes(&job);
    assert_eq!(out.len(), 6);

    let hits = mock.hits();
    assert_eq!(hits.len(), 6, "one request per unit");
    for h in &hits {
        assert_eq!(h.path, "/v1/chat/completions");
        assert_eq!(
            h.headers.get("authorization").and_then(|v| v.to_str().ok()),
            Some(format!("Bearer {secret}").as_str())
        );
        let b = &h.body;
        assert_eq!(b["model"], "test-model");
        assert_eq!(
            b["messages"][0],
            json!({"role": "system", "content": job.prefix})
        );
        assert_eq!(b["messages"][1], json!({"role": "user", "content": h.unit}));
        assert_eq!(b["max_tokens"], 64);
        assert_eq!(b["seed"], 7);
        assert_eq!(b["temperature"], 0.0);
        assert_eq!(b["response_format"]["type"], "json_schema");
        assert_eq!(b["response_format"]["json_schema"]["strict"], true);
        assert_eq!(b["response_format"]["json_schema"]["schema"], job_schema());
        assert!(b.get("stream").is_none());
    }
    // The prefix bytes are identical across requests.
    let systems: BTreeSet<String> = hits
        .iter()
        .map(|h| h.body["messages"][0].to_string())
        .collect();
    assert_eq!(systems.len(), 1);

    // Warm-up: the first request finished before any other started.
    let first_end = mock.state.ends.lock().expect("ends")[&0];
    assert!(hits[1..].iter().all(|h| h.start_seq > first_end));

    // Usage as the provider reported it: the warm-up evaluated the whole
    // prompt, later requests found 64 tokens of it cached.
    let warm = backend.stats().warm_up.expect("warm-up usage");
    assert_eq!((warm.prompt_tokens, warm.cached_tokens), (100, 0));
    for (unit, r) in &out {
        let c = r.as_ref().expect("success");
        assert_eq!(c.text, answer(unit));
        let u = c.usage;
        let expected = if *unit == hits[0].unit {
            (100, 0, 5)
        } else {
            (36, 64, 5)
        };
        assert_eq!(
            (u.prompt_tokens, u.cached_tokens, u.completion_tokens),
            expected,
            "{unit}"
        );
    }
    let stats = backend.stats();
    assert_eq!(stats.cached_tokens, 5 * 64);
    assert_eq!((stats.requests, stats.retries, stats.succeeded), (6, 0, 6));

    // No `/models` listing: the identity is the host and the alias.
    let info = backend.info();
    assert_eq!(info.kind, "openai");
    assert_eq!(info.model_id, format!("{}/test-model", mock.addr));
    assert!(!info.simulated);
}

/// The identity names what the server says it serves under the alias, so
/// weights swapped behind one alias are new facts, not stale ones; fields
/// that change on every request (`created`) do not change it.
#[test]
fn openai_identity_names_the_weights_the_server_lists() {
    key();
    let listing = |root: &str, created: u64| {
        json!({"object": "list", "data": [
            {"id": "other", "object": "model", "created": 1, "root": "x"},
            {"id": "test-model", "object": "model", "created": created, "root": root,
             "meta": {"n_params": 135_000_000}}
        ]})
    };
    // Each on its own server: an endpoint is asked once per process.
    let identity = |listed: Value| {
        let mock = Mock::start();
        *mock.state.models.lock().expect("models") = Some(listed);
        let id = OpenAiBackend::new(openai(vec![endpoint(mock.openai_url(), 1)]))
            .expect("backend")
            .info()
            .model_id;
        assert!(mock.hits().is_empty(), "asking is not a model call");
        id.replace(&mock.addr.to_string(), "HOST")
    };
    let a = identity(listing("/models/a.gguf", 1));
    assert!(a.starts_with("HOST/test-model@test-model#"), "{a}");
    assert_eq!(
        identity(listing("/models/a.gguf", 99)),
        a,
        "`created` is not the weights"
    );
    assert_ne!(
        identity(listing("/models/b.gguf", 1)),
        a,
        "other weights behind the same alias"
    );
    // A server listing one model serves it under any name (llama.cpp's
    // lists its file path).
    let one = identity(json!({"data": [{"id": "/models/a.gguf", "object": "model"}]}));
    assert!(one.starts_with("HOST/test-model@/models/a.gguf#"), "{one}");
}

/// Every endpoint of a weighted pool is asked what it serves: a pool whose
/// second member lists other weights is refused, naming both endpoints and
/// what each serves, before any call; one whose members list the same
/// weights is keyed by them.
#[test]
fn a_pool_whose_members_serve_other_weights_is_refused() {
    key();
    let serving = |root: &str| {
        let mock = Mock::start();
        *mock.state.models.lock().expect("models") = Some(json!({"data": [
            {"id": "test-model", "object": "model", "root": root}
        ]}));
        mock
    };
    let (a, b, same) = (
        serving("/w/a.gguf"),
        serving("/w/b.gguf"),
        serving("/w/a.gguf"),
    );
    let pool = |second: &Mock| {
        OpenAiBackend::new(openai(vec![
            EndpointConfig {
                weight: 3,
                ..endpoint(a.openai_url(), 1)
            },
            endpoint(second.openai_url(), 1),
        ]))
        .expect("backend")
    };

    let mixed = pool(&b);
    let err = mixed.check_pool().expect_err("a pool of two models");
    let text = err.to_string();
    assert!(matches!(err, HttpError::MixedPool(_)), "{text}");
    for m in [&a, &b] {
        assert!(
            text.contains(&format!("{} serves `test-model#", m.openai_url())),
            "{text}"
        );
    }
    assert_eq!(mixed.served(), None, "no one identity for two models");
    assert!(a.hits().is_empty() && b.hits().is_empty(), "no model call");

    let agreed = pool(&same);
    agreed.check_pool().expect("one model");
    let served = agreed.served().expect("named").to_owned();
    let alone = OpenAiBackend::new(openai(vec![endpoint(a.openai_url(), 1)])).expect("backend");
    assert_eq!(alone.served(), Some(served.as_str()), "the same weights");
}

#[test]
fn openai_log_probabilities_give_each_decision_value_its_probability() {
    key();
    let mock = Mock::start();
    let backend = OpenAiBackend::new(OpenAiConfig {
        logprobs: true,
        ..openai(vec![endpoint(mock.openai_url(), 2)])
    })
    .expect("backend");
    assert!(backend.info().model_id.ends_with("+logprobs"));
    let decision = |unit: &str| fanfold_model::DecisionField {
        key: "unit".into(),
        choices: vec![unit.to_owned(), "zz".into()],
    };
    let job = numbered(1, 1).with_decision(decision("u0"));
    backend.run(&job).expect("run");
    let got = outcomes(&job);
    let c = got["u0"].as_ref().expect("answered");
    let choices = c.choices.as_ref().expect("probabilities");
    assert_eq!(choices[0].0, "u0");
    assert!((choices[0].1 - 0.75).abs() < 1e-9, "{choices:?}");
    assert!((choices[1].1 - 0.25).abs() < 1e-9, "{choices:?}");
    for h in mock.hits() {
        assert_eq!(h.body["logprobs"], true);
        assert_eq!(h.body["top_logprobs"], 20);
    }
    // Off by default: nothing asked, nothing read.
    let mock = Mock::start();
    let plain = OpenAiBackend::new(openai(vec![endpoint(mock.openai_url(), 2)])).expect("backend");
    let job = numbered(1, 1).with_decision(decision("u0"));
    plain.run(&job).expect("run");
    assert_eq!(
        outcomes(&job)["u0"].as_ref().expect("answered").choices,
        None
    );
    assert!(mock.hits().iter().all(|h| h.body.get("logprobs").is_none()));
}

#[test]
fn openai_prompt_mode_and_per_request_schemas() {
    key();
    let mock = Mock::start();
    let prompt_only = OpenAiBackend::new(OpenAiConfig {
        output: OutputMode::Prompt,
        ..openai(vec![endpoint(mock.openai_url(), 2)])
    })
    .expect("backend");
    let job = numbered(2, 2);
    prompt_only.run(&job).expect("run");
    assert!(outcomes(&job).values().all(Result::is_ok));
    assert!(
        mock.hits()
            .iter()
            .all(|h| h.body.get("response_format").is_none())
    );

    let mock = Mock::start();
    let narrowed = OpenAiBackend::new(OpenAiConfig {
        per_request_schema: true,
        strict: false,
        ..openai(vec![endpoint(mock.openai_url(), 2)])
    })
    .expect("backend");
    let job = numbered(2, 2);
    narrowed.run(&job).expect("run");
    assert!(outcomes(&job).values().all(Result::is_ok));
    for h in mock.hits() {
        let f = &h.body["response_format"]["json_schema"];
        assert_eq!(f["strict"], false);
        assert_eq!(f["schema"]["properties"]["unit"]["const"], json!(h.unit));
    }
}

#[test]
fn openai_streaming_reads_events_and_usage() {
    key();
    let mock = Mock::start();
    let backend = OpenAiBackend::new(OpenAiConfig {
        stream: true,
        ..openai(vec![endpoint(mock.openai_url(), 2)])
    })
    .expect("backend");
    let job = numbered(4, 2);
    backend.run(&job).expect("run");
    let out = outcomes(&job);
    let hits = mock.hits();
    for h in &hits {
        assert_eq!(h.body["stream"], true);
        assert_eq!(h.body["stream_options"], json!({"include_usage": true}));
    }
    for (unit, r) in &out {
        let c = r.as_ref().expect("success");
        assert_eq!(c.text, answer(unit));
        let expected = if *unit == hits[0].unit {
            (100, 0)
        } else {
            (36, 64)
        };
        assert_eq!((c.usage.prompt_tokens, c.usage.cached_tokens), expected);
        assert_eq!(c.usage.completion_tokens, 5);
    }
}

#[test]
fn anthropic_caches_the_system_block_and_forces_one_tool() {
    let (_, secret) = key();
    let mock = Mock::start();
    let backend = AnthropicBackend::new(AnthropicConfig {
        transport: transport(vec![endpoint(mock.anthropic_url(), 2)]),
        ..AnthropicConfig::new("claude-test", Vec::new())
    })
    .expect("backend");
    let job = numbered(3, 2);
    backend.run(&job).expect("run");
    let out = outcomes(&job);
    let hits = mock.hits();
    assert_eq!(hits.len(), 3);
    for h in &hits {
        assert_eq!(h.path, "/v1/messages");
        let header = |k: &str| h.headers.get(k).and_then(|v| v.to_str().ok());
        assert_eq!(header("x-api-key"), Some(secret));
        assert_eq!(header("anthropic-version"), Some("2023-06-01"));
        assert_eq!(header("authorization"), None);
        let b = &h.body;
        assert_eq!(
            b["system"],
            json!([{"type": "text", "text": job.prefix, "cache_control": {"type": "ephemeral"}}])
        );
        assert_eq!(b["messages"], json!([{"role": "user", "content": h.unit}]));
        assert_eq!(b["max_tokens"], 64);
        assert_eq!(b["tools"].as_array().map(Vec::len), Some(1));
        assert_eq!(b["tools"][0]["name"], "emit");
        // The job's schema, identical on every request, not the unit's.
        assert_eq!(b["tools"][0]["input_schema"], job_schema());
        assert_eq!(b["tool_choice"], json!({"type": "tool", "name": "emit"}));
    }
    for (unit, r) in &out {
        let c = r.as_ref().expect("success");
        assert_eq!(c.text, answer(unit), "the tool input is the answer");
        let u = c.usage;
        let expected = if *unit == hits[0].unit {
            (100, 0)
        } else {
            (36, 64)
        };
        assert_eq!(
            (u.prompt_tokens, u.cached_tokens, u.completion_tokens),
            (expected.0, expected.1, 5)
        );
    }
    let info = backend.info();
    assert_eq!(info.kind, "anthropic");
    assert_eq!(info.model_id, format!("{}/claude-test", mock.addr));
}

#[test]
fn transport_faults_are_retried_boundedly_with_distinct_causes() {
    key();
    let mock = Mock::start();
    mock.plan("ra429", vec![Action::Status(429, Some("1")), Action::Ok]);
    mock.plan("rate429", vec![Action::Status(429, None)]);
    mock.plan("err500", vec![Action::Status(500, None)]);
    mock.plan("flaky502", vec![Action::Status(502, None), Action::Ok]);
    mock.plan("slow", vec![Action::Slow(5_000)]);
    mock.plan("trunc", vec![Action::Truncate]);
    mock.plan("abort", vec![Action::Abort]);
    mock.plan("garbage", vec![Action::Garbage]);
    mock.plan("bad400", vec![Action::Status(400, None)]);
    let mut config = openai(vec![endpoint(mock.openai_url(), 4)]);
    // Generous, so that on a loaded machine only "slow" times out.
    config.transport.request_timeout_ms = 1_000;
    let backend = OpenAiBackend::new(config).expect("backend");
    let units = [
        "ok", "ra429", "rate429", "err500", "flaky502", "slow", "trunc", "abort", "garbage",
        "bad400",
    ];
    let job = job(&units, 4);
    backend.run(&job).expect("run");
    let out = outcomes(&job);
    assert_eq!(out.len(), units.len(), "no request lost");

    // max_retries = 2: a fault that persists is sent three times; a fault
    // that a retry cannot cure is sent once.
    let expected_hits = [
        ("ok", 1),
        ("ra429", 2),
        ("rate429", 3),
        ("err500", 3),
        ("flaky502", 2),
        ("slow", 3),
        ("trunc", 3),
        ("abort", 3),
        ("garbage", 1),
        ("bad400", 1),
    ];
    for (unit, n) in expected_hits {
        assert_eq!(mock.hits_for(unit), n, "server hits for {unit}");
    }

    // Retry-After: 1 was honoured.
    let ra: Vec<_> = mock
        .hits()
        .into_iter()
        .filter(|h| h.unit == "ra429")
        .collect();
    assert!(ra[1].at.duration_since(ra[0].at) >= Duration::from_secs(1));
    for unit in ["ok", "ra429", "flaky502"] {
        assert_eq!(out[unit].as_ref().expect(unit).text, answer(unit));
    }
    let err = |u: &str| out[u].clone().expect_err(u);
    assert_eq!(
        err("rate429"),
        CallError::RateLimited {
            attempts: 3,
            retry_after_ms: None
        }
    );
    match err("err500") {
        CallError::Http {
            status,
            body_excerpt,
        } => {
            assert_eq!(status, 500);
            assert!(body_excerpt.contains("injected 500"), "{body_excerpt}");
        }
        other => panic!("err500: {other:?}"),
    }
    assert_eq!(err("slow"), CallError::Timeout { ms: 1_000 });
    assert!(
        matches!(err("trunc"), CallError::Truncated(_)),
        "{:?}",
        err("trunc")
    );
    assert!(
        matches!(err("abort"), CallError::Truncated(_)),
        "{:?}",
        err("abort")
    );
    assert!(
        matches!(err("garbage"), CallError::InvalidResponse(_)),
        "{:?}",
        err("garbage")
    );
    assert!(matches!(err("bad400"), CallError::Http { status: 400, .. }));
    let codes: BTreeSet<&str> = ["rate429", "err500", "slow", "trunc", "garbage"]
        .iter()
        .map(|u| err(u).code())
        .collect();
    assert_eq!(codes.len(), 5, "{codes:?}");

    let stats = backend.stats();
    let total: usize = expected_hits.iter().map(|(_, n)| n).sum();
    assert_eq!(stats.requests, total as u64);
    assert_eq!(stats.retries, (total - units.len()) as u64);
    assert_eq!(stats.rate_limited, 4);
    assert_eq!((stats.succeeded, stats.failed), (3, 7));
}

#[test]
fn a_retry_after_beyond_the_limit_fails_at_once() {
    key();
    let mock = Mock::start();
    mock.set_default(Action::Status(429, Some("3600")));
    let mut config = openai(vec![endpoint(mock.openai_url(), 1)]);
    config.transport.retry.max_retry_after_ms = 100;
    let backend = OpenAiBackend::new(config).expect("backend");
    let job = numbered(1, 1);
    backend.run(&job).expect("run");
    let out = outcomes(&job);
    assert_eq!(
        out["u0"],
        Err(CallError::RateLimited {
            attempts: 1,
            retry_after_ms: Some(3_600_000)
        })
    );
    assert_eq!(mock.hits().len(), 1);
}

#[test]
fn dropped_connections_are_retried_then_reported() {
    key();
    let server = DropServer::start();
    let backend = OpenAiBackend::new(openai(vec![endpoint(
        format!("http://{}/v1", server.addr),
        2,
    )]))
    .expect("backend");
    let job = numbered(2, 2);
    backend.run(&job).expect("run");
    for (unit, r) in outcomes(&job) {
        let e = r.expect_err(&unit);
        assert_eq!(e.code(), "connection", "{e}");
    }
    assert_eq!(server.hits.load(std::sync::atomic::Ordering::SeqCst), 6);
}

#[test]
fn concurrency_caps_hold_per_endpoint() {
    key();
    let a = Mock::start();
    let b = Mock::start();
    for m in [&a, &b] {
        m.state
            .delay_ms
            .store(20, std::sync::atomic::Ordering::SeqCst);
    }
    let backend = OpenAiBackend::new(openai(vec![
        endpoint(a.openai_url(), 2),
        endpoint(b.openai_url(), 3),
    ]))
    .expect("backend");
    let job = numbered(40, 16);
    backend.run(&job).expect("run");
    assert!(outcomes(&job).values().all(Result::is_ok));
    assert_eq!(a.hits().len() + b.hits().len(), 40);
    assert!(a.max_in_flight() <= 2, "a: {}", a.max_in_flight());
    assert!(b.max_in_flight() <= 3, "b: {}", b.max_in_flight());
    // Never more requests held than the endpoints can take.
    let held = job.max_in_flight();
    assert!(held <= 5, "{held}");
}

#[test]
fn requests_per_minute_budget_spaces_requests() {
    key();
    let mock = Mock::start();
    let mut config = openai(vec![EndpointConfig {
        requests_per_minute: Some(600),
        ..endpoint(mock.openai_url(), 8)
    }]);
    config.transport.warm_up = false;
    let backend = OpenAiBackend::new(config).expect("backend");
    let job = numbered(30, 8);
    backend.run(&job).expect("run");
    assert!(outcomes(&job).values().all(Result::is_ok));
    let hits = mock.hits();
    assert_eq!(hits.len(), 30);
    // 600 a minute is 10 a second with a bucket of 10: any half second
    // holds at most 10 + 5. Unlimited, all 30 would land together.
    let window = Duration::from_millis(500);
    for h in &hits {
        let inside = hits
            .iter()
            .filter(|o| o.at >= h.at && o.at.duration_since(h.at) < window)
            .count();
        assert!(inside <= 19, "{inside} requests within 500 ms");
    }
}

#[test]
fn exhausted_provider_window_holds_the_endpoint() {
    key();
    let mock = Mock::start();
    mock.plan(
        "u0",
        vec![Action::OkWithHeaders(vec![
            ("x-ratelimit-remaining-requests", "0".into()),
            ("x-ratelimit-reset-requests", "400ms".into()),
        ])],
    );
    let backend =
        OpenAiBackend::new(openai(vec![endpoint(mock.openai_url(), 2)])).expect("backend");
    let job = numbered(3, 2);
    backend.run(&job).expect("run");
    assert!(outcomes(&job).values().all(Result::is_ok));
    let hits = mock.hits();
    assert_eq!(hits[0].unit, "u0");
    for h in &hits[1..] {
        let gap = h.at.duration_since(hits[0].at);
        assert!(gap >= Duration::from_millis(400), "{gap:?}");
    }
}

#[test]
fn circuit_breaker_moves_traffic_to_the_healthy_endpoint() {
    key();
    let sick = Mock::start();
    sick.set_default(Action::Status(500, None));
    let well = Mock::start();
    // The pick is weighted at random; weighting the sick endpoint heavily
    // makes it take the first picks for certain, so its breaker must open
    // rather than merely may.
    let heavy = EndpointConfig {
        weight: 1_000,
        ..endpoint(sick.openai_url(), 1)
    };
    let mut config = openai(vec![heavy, endpoint(well.openai_url(), 1)]);
    config.transport.retry.max_retries = 3;
    config.transport.breaker = BreakerConfig {
        failure_threshold: 3,
        cooldown_ms: 60_000,
    };
    let backend = OpenAiBackend::new(config).expect("backend");
    let job = numbered(20, 2);
    backend.run(&job).expect("run");
    assert!(
        outcomes(&job).values().all(Result::is_ok),
        "retries moved to the healthy endpoint"
    );
    assert_eq!(sick.hits().len(), 3, "the breaker opened at its threshold");
    assert_eq!(well.hits().len(), 20);
    let stats = backend.stats();
    assert_eq!(stats.endpoints[0].breaker_opened, 1);
    assert_eq!(stats.endpoints[0].failures, sick.hits().len() as u64);
    assert_eq!(stats.endpoints[1].breaker_opened, 0);
}

#[test]
fn open_breakers_fail_requests_in_bounded_attempts() {
    key();
    let sick = Mock::start();
    sick.set_default(Action::Status(503, None));
    let mut config = openai(vec![endpoint(sick.openai_url(), 1)]);
    config.transport.retry.max_retries = 3;
    config.transport.breaker = BreakerConfig {
        failure_threshold: 2,
        cooldown_ms: 30,
    };
    let backend = OpenAiBackend::new(config).expect("backend");
    let job = numbered(3, 1);
    backend.run(&job).expect("run");
    for (unit, r) in outcomes(&job) {
        // The last real failure is the cause, not the breaker.
        assert!(
            matches!(r, Err(CallError::Http { status: 503, .. })),
            "{unit}: {r:?}"
        );
    }
    assert!(sick.hits().len() <= 12, "{}", sick.hits().len());
    assert!(backend.stats().endpoints[0].breaker_opened >= 1);
}

#[test]
fn cancellation_stops_sending() {
    key();
    let mock = Mock::start();
    let backend =
        OpenAiBackend::new(openai(vec![endpoint(mock.openai_url(), 2)])).expect("backend");
    let mut job = numbered(10, 2);
    job.cancel_after = 1;
    backend.run(&job).expect("run");
    let out = outcomes(&job);
    assert_eq!(out.len(), 10);
    assert_eq!(mock.hits().len(), 1, "only the warm-up request was sent");
    assert_eq!(out.values().filter(|r| r.is_ok()).count(), 1);
    assert!(
        out.values()
            .filter_map(|r| r.as_ref().err())
            .all(|e| *e == CallError::Cancelled)
    );
}

#[test]
fn weighted_pool_splits_traffic() {
    key();
    let heavy = Mock::start();
    let light = Mock::start();
    let mut config = openai(vec![
        EndpointConfig {
            weight: 3,
            ..endpoint(heavy.openai_url(), 8)
        },
        endpoint(light.openai_url(), 8),
    ]);
    config.transport.warm_up = false;
    let backend = OpenAiBackend::new(config).expect("backend");
    let job = numbered(80, 1);
    backend.run(&job).expect("run");
    assert!(outcomes(&job).values().all(Result::is_ok));
    // Expected 60 and 20; the bounds are more than five deviations wide.
    let h = heavy.hits().len();
    assert!((40..=76).contains(&h), "heavy endpoint got {h} of 80");
    assert_eq!(h + light.hits().len(), 80);
}

#[test]
fn api_key_appears_in_no_printable_surface() {
    let (var, secret) = key();
    let mock = Mock::start();
    let config = openai(vec![endpoint(mock.openai_url(), 2)]);
    let backend = OpenAiBackend::new(config.clone()).expect("backend");
    let job = numbered(3, 2);
    backend.run(&job).expect("run");
    let out = outcomes(&job);
    let anthropic = AnthropicBackend::new(AnthropicConfig {
        transport: transport(vec![endpoint(mock.anthropic_url(), 1)]),
        ..AnthropicConfig::new("claude-test", Vec::new())
    })
    .expect("backend");
    let mut surfaces = vec![
        format!("{backend:?}"),
        format!("{anthropic:?}"),
        format!("{config:?}"),
        serde_json::to_string(&config).expect("config serializes"),
        format!("{:?}", backend.info()),
        serde_json::to_string(&backend.info()).expect("info serializes"),
        format!("{:?}", anthropic.info()),
        format!("{:?}", backend.stats()),
    ];
    for r in out.values() {
        let c = r.as_ref().expect("success");
        surfaces.push(format!("{c:?}"));
        surfaces.push(c.text.clone());
    }
    for s in &surfaces {
        assert!(!s.contains(secret), "key leaked into {s}");
    }
    assert!(surfaces[2].contains(var), "the config names the variable");

    // A provider that echoes the credentials it was sent: the error keeps
    // the cause and loses the key. The endpoint is set aside after the
    // first 401, so the other requests fail without being sent.
    let echo = Mock::start();
    echo.set_default(Action::EchoAuth401);
    let backend =
        OpenAiBackend::new(openai(vec![endpoint(echo.openai_url(), 2)])).expect("backend");
    let job = numbered(3, 2);
    backend.run(&job).expect("run");
    for (unit, r) in outcomes(&job) {
        let e = r.expect_err(&unit);
        let text = format!("{e} {e:?}");
        assert!(!text.contains(secret), "key leaked into {text}");
        match &e {
            CallError::Http {
                status: 401,
                body_excerpt,
            } => {
                assert!(
                    body_excerpt.contains("Incorrect API key provided: Bearer [redacted]"),
                    "{body_excerpt}"
                );
            }
            other => panic!("{unit}: {other:?}"),
        }
    }
    assert_eq!(echo.hits().len(), 1);

    // A missing variable is named; nothing else is printed.
    let missing = OpenAiBackend::new(openai(vec![EndpointConfig {
        api_key_env: Some("FANFOLD_HTTP_TEST_UNSET_VARIABLE".into()),
        ..EndpointConfig::new(mock.openai_url())
    }]));
    match missing {
        Err(e @ HttpError::MissingKey { .. }) => {
            assert!(e.to_string().contains("FANFOLD_HTTP_TEST_UNSET_VARIABLE"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn configs_read_from_toml() {
    key();
    let config: OpenAiConfig = toml::from_str(
        r#"
        model = "qwen2.5-0.5b-instruct"
        stream = true
        [transport]
        request_timeout_ms = 60000
        [[transport.endpoints]]
        base_url = "http://127.0.0.1:8080/v1"
        max_concurrency = 4
        [[transport.endpoints]]
        base_url = "https://api.example.com/v1"
        api_key_env = "EXAMPLE_API_KEY"
        weight = 2
        requests_per_minute = 500
        tokens_per_minute = 200000
        [transport.retry]
        max_retries = 6
        "#,
    )
    .expect("parses");
    assert_eq!(config.transport.endpoints.len(), 2);
    assert_eq!(config.transport.endpoints[1].weight, 2);
    assert_eq!(config.transport.retry.max_retries, 6);
    assert_eq!(
        config.transport.retry.backoff_base_ms,
        RetryConfig::default().backoff_base_ms
    );
    assert_eq!(config.temperature, Some(0.0));
    assert_eq!(config.output, OutputMode::JsonSchema);
    assert!(config.transport.warm_up);

    let typo: Result<OpenAiConfig, _> =
        toml::from_str("model = \"m\"\n[transport]\nendpoints = []\nrequest_timeout = 5\n");
    assert!(typo.is_err(), "unknown fields are refused");

    let no_endpoints = OpenAiBackend::new(openai(Vec::new()));
    assert!(matches!(no_endpoints, Err(HttpError::Config(_))));
    let bad_url = OpenAiBackend::new(openai(vec![EndpointConfig::new("ftp://x/v1")]));
    assert!(matches!(bad_url, Err(HttpError::BadUrl { .. })));
    let value: Value = serde_json::to_value(&config).expect("serializes");
    assert_eq!(
        value["transport"]["endpoints"][1]["api_key_env"],
        "EXAMPLE_API_KEY"
    );
}

/// A key the server puts in a successful answer reaches no completion:
/// the text every fact, cassette and log is made from is scrubbed.
#[test]
fn a_key_echoed_in_an_answer_is_redacted() {
    let (_, secret) = key();
    let mock = Mock::start();
    mock.set_default(Action::EchoAuth200);
    let backend =
        OpenAiBackend::new(openai(vec![endpoint(mock.openai_url(), 2)])).expect("backend");
    let job = numbered(3, 2);
    backend.run(&job).expect("run");
    let out = outcomes(&job);
    assert_eq!(out.len(), 3);
    for (unit, r) in out {
        let c = r.unwrap_or_else(|e| panic!("{unit}: {e}"));
        assert!(!c.text.contains(secret), "key leaked into {}", c.text);
        assert!(c.text.contains("Bearer [redacted]"), "{}", c.text);
    }
}

/// A body over the bound is an error of its unit, refused as it streams
/// in (no length announced), not read whole; one under it is read.
#[test]
fn response_bodies_are_bounded() {
    let mock = Mock::start();
    mock.set_default(Action::Huge(1 << 20));
    let mut config = openai(vec![endpoint(mock.openai_url(), 1)]);
    config.transport.max_response_bytes = 64 << 10;
    let backend = OpenAiBackend::new(config.clone()).expect("backend");
    let job = numbered(2, 1);
    backend.run(&job).expect("run");
    for (unit, r) in outcomes(&job) {
        let e = r.expect_err(&unit);
        assert_eq!(e.code(), "invalid_response", "{e}");
        assert!(e.to_string().contains("max_response_bytes = 65536"), "{e}");
    }
    // Not retried: the same server would send the same body.
    assert_eq!(mock.hits().len(), 2);

    // An ordinary answer is far under the bound.
    let ok = Mock::start();
    let backend = OpenAiBackend::new(OpenAiConfig {
        transport: TransportConfig {
            endpoints: vec![endpoint(ok.openai_url(), 1)],
            ..config.transport
        },
        ..config
    })
    .expect("backend");
    let job = numbered(2, 1);
    backend.run(&job).expect("run");
    assert!(outcomes(&job).values().all(Result::is_ok));

    let mut zero = openai(vec![endpoint(ok.openai_url(), 1)]);
    zero.transport.max_response_bytes = 0;
    assert!(OpenAiBackend::new(zero).is_err());
}
