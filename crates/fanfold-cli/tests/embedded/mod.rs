//! The embedded model. These run the real default model on a handful of
//! units and assert structure, never labels.

use fanfold_llama::{Attention, EmbeddedModel, LlamaConfig};
use fanfold_model::{CallError, Completion, ModelBackend, Request};
use fanfold_testkit::QueueJob;
use serde_json::{Value, json};

fn model(share_prefix: bool) -> EmbeddedModel {
    model_with(share_prefix, 768)
}

fn model_with(share_prefix: bool, slot_tokens: u32) -> EmbeddedModel {
    model_in(share_prefix, slot_tokens, Attention::default())
}

fn model_in(share_prefix: bool, slot_tokens: u32, attention: Attention) -> EmbeddedModel {
    let path = fanfold_engine::models::ensure(
        &fanfold_engine::models::SMOLLM2_135M,
        &fanfold_engine::models::cache_dir(),
        &|l| eprintln!("{l}"),
    )
    .expect("the default model is available (run `fanfold model fetch`)");
    let mut cfg = LlamaConfig::new(path);
    cfg.share_prefix = share_prefix;
    cfg.slot_tokens = slot_tokens;
    cfg.attention = attention;
    EmbeddedModel::load(cfg).expect("loads")
}

/// A job over log lines, one request each, handing out at most
/// `limit` (a stand-in for a contract that cancels the rest).
fn log_job(units: &[&str], slots: usize, limit: usize) -> QueueJob {
    let schema = json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["decision", "component"],
        "properties": {
            "decision": {"enum": ["yes", "no"]},
            "component": {"enum": ["kernel", "application", "other"]}
        }
    });
    let prefix = format!(
        "Decide whether the log line reports a hardware failure. Answer with JSON matching this schema:\n{schema}\n"
    );
    let requests: Vec<Request> = units
        .iter()
        .enumerate()
        .map(|(i, u)| Request {
            index: i,
            unit_id: format!("u{i}"),
            suffix: format!("Log line: {u}\n"),
            input: Value::Null,
            attempt: 1,
            max_output_tokens: 64,
            schema: None,
        })
        .collect();
    let decision = fanfold_model::DecisionField {
        key: "decision".into(),
        choices: vec!["yes".into(), "no".into()],
    };
    let mut job = QueueJob::new(prefix, requests, slots)
        .with_schema(schema)
        .with_decision(decision);
    job.limit = limit;
    job
}

/// Every answer, by unit id, once the backend kept the job's contract;
/// and the most requests it held at once.
fn results(job: &QueueJob) -> (Vec<(String, Completion)>, usize) {
    let breaches = job.contract_breaches();
    assert!(breaches.is_empty(), "{breaches:?}");
    let mut ok: Vec<(String, Completion)> = job
        .finished()
        .into_iter()
        .map(|f| (f.request.unit_id, f.result.expect("every call succeeds")))
        .collect();
    ok.sort_by(|a, b| a.0.cmp(&b.0));
    (ok, job.max_in_flight())
}

const LINES: [&str; 5] = [
    "RAS KERNEL FATAL data storage interrupt",
    "RAS KERNEL INFO instruction cache parity error corrected",
    "RAS APP FATAL ciod: failed to read message prefix on control stream",
    "RAS KERNEL INFO generating core.2275",
    "RAS KERNEL FATAL machine check interrupt (bit=0x1d): L2 dcache unit data parity error",
];

/// Once the job is cancelled, units mid-decode are abandoned and handed
/// back as cancelled, each exactly once, and nothing new is started.
#[test]
fn cancellation_abandons_units_in_flight() {
    // Decoded one step at a time, these lines' answers finish at
    // different steps, so slots are busy when the first one comes;
    // jumping over the forced rest of each answer finishes all four
    // in the same step.
    let mut m = model(true);
    m.set_jump_forward(false);
    let units: Vec<&str> = LINES.iter().chain(LINES.iter()).copied().collect();
    let mut job = log_job(&units, 4, usize::MAX);
    job.cancel_after = 1;
    m.run(&job).expect("runs");
    let breaches = job.contract_breaches();
    assert!(breaches.is_empty(), "{breaches:?}");
    let done = job.finished();
    let cancelled = done
        .iter()
        .filter(|f| matches!(f.result, Err(CallError::Cancelled)))
        .count();
    let answered = done.iter().filter(|f| f.result.is_ok()).count();
    assert_eq!(
        done.len(),
        job.handed(),
        "every handed unit comes back once"
    );
    assert!(answered >= 1);
    assert!(cancelled >= 1, "slots were busy when the first answer came");
    assert!(
        job.handed() < units.len(),
        "no unit starts after cancellation"
    );
}

/// A unit longer than its slot is cut to fit, and the completion says
/// by how many tokens, so the fact can record it; a short one is whole.
#[test]
fn a_unit_cut_to_fit_its_slot_says_so() {
    let m = model_with(true, 320);
    let long = LINES[0].repeat(60);
    let job = log_job(&[LINES[1], long.as_str()], 1, usize::MAX);
    m.run(&job).expect("runs");
    let (done, _) = results(&job);
    assert_eq!(done.len(), 2);
    let cut: Vec<u64> = done.iter().map(|(_, c)| c.truncated_tokens).collect();
    assert_eq!(cut.iter().filter(|&&n| n == 0).count(), 1, "{cut:?}");
    assert!(cut.iter().any(|&n| n > 100), "{cut:?}");
}

#[test]
fn typed_outputs_with_exact_usage_and_bounded_slots() {
    let m = model(true);
    let job = log_job(&LINES, 2, usize::MAX);
    m.run(&job).expect("runs");
    let validator =
        jsonschema::validator_for(job.schema.as_ref().expect("a schema")).expect("schema");
    let (done, max_in_flight) = results(&job);
    assert_eq!(done.len(), LINES.len());
    assert!(max_in_flight <= 2, "in flight {max_in_flight}");
    let cached: Vec<u64> = done.iter().map(|(_, c)| c.usage.cached_tokens).collect();
    let prefix_len = cached.iter().copied().max().expect("some");
    // The prefix is billed once, to one unit; the others reused it.
    assert_eq!(cached.iter().filter(|c| **c == 0).count(), 1, "{cached:?}");
    assert_eq!(
        cached.iter().filter(|c| **c == prefix_len).count(),
        LINES.len() - 1
    );
    for (id, c) in &done {
        let v: Value =
            serde_json::from_str(&c.text).unwrap_or_else(|e| panic!("{id}: {e}: {}", c.text));
        assert!(validator.is_valid(&v), "{id}: {}", c.text);
        // The grammar allows no whitespace between JSON tokens.
        assert_eq!(
            serde_json::to_string(&v).ok().as_ref(),
            Some(&c.text),
            "{id}"
        );
        assert!(c.usage.completion_tokens > 0 && c.usage.prompt_tokens > 0);
    }
}

#[test]
fn shared_prefix_matches_the_unshared_path() {
    let shared = log_job(&LINES[..3], 1, usize::MAX);
    model(true).run(&shared).expect("runs");
    let naive = log_job(&LINES[..3], 1, usize::MAX);
    model(false).run(&naive).expect("runs");
    let (a, _) = results(&shared);
    let (b, _) = results(&naive);
    // Evaluated in the same chunk shapes, the shared path gives the same
    // logits as the unshared one: same answers, same choice probabilities.
    let texts =
        |r: &[(String, Completion)]| r.iter().map(|(_, c)| c.text.clone()).collect::<Vec<_>>();
    assert_eq!(texts(&a), texts(&b));
    for ((id, x), (_, y)) in a.iter().zip(&b) {
        let (px, py) = (
            x.choices.as_ref().expect("scored"),
            y.choices.as_ref().expect("scored"),
        );
        for ((cx, vx), (cy, vy)) in px.iter().zip(py) {
            assert_eq!(cx, cy);
            assert!(
                (vx - vy).abs() < 1e-9,
                "{id} {cx}: shared {vx} vs naive {vy}"
            );
        }
        let pick = |p: &[(String, f64)]| {
            p.iter()
                .max_by(|l, r| l.1.total_cmp(&r.1))
                .map(|c| c.0.clone())
        };
        if (px[0].1 - px[1].1).abs() > 0.1 {
            assert_eq!(pick(px), pick(py), "{id}");
        }
    }
    let prompt =
        |r: &[(String, Completion)]| r.iter().map(|(_, c)| c.usage.prompt_tokens).sum::<u64>();
    let prefix_len = a
        .iter()
        .map(|(_, c)| c.usage.cached_tokens)
        .max()
        .expect("some");
    // Naive evaluates the prefix for every unit; shared evaluates it once.
    assert_eq!(prompt(&b), prompt(&a) + 2 * prefix_len);
    assert!(b.iter().all(|(_, c)| c.usage.cached_tokens == 0));
}

/// One unified KV cache without flash attention changes how attention
/// is computed, not what a job is: every unit answers under the schema,
/// and the prompt tokens evaluated and reused are the default layout's.
#[test]
fn the_unified_layout_answers_under_the_same_contract() {
    let unified = log_job(&LINES[..4], 2, usize::MAX);
    model_in(true, 768, Attention::UnifiedWithoutFlash)
        .run(&unified)
        .expect("runs");
    let default = log_job(&LINES[..4], 2, usize::MAX);
    model(true).run(&default).expect("runs");
    let (a, _) = results(&unified);
    let (b, _) = results(&default);
    assert_eq!(a.len(), 4);
    for (id, c) in &a {
        let v: Value = serde_json::from_str(&c.text).expect("JSON under the grammar");
        assert!(
            matches!(v["decision"].as_str(), Some("yes" | "no")),
            "{id}: {}",
            c.text
        );
    }
    let usage = |r: &[(String, Completion)]| {
        r.iter()
            .map(|(id, c)| (id.clone(), c.usage.prompt_tokens, c.usage.cached_tokens))
            .collect::<Vec<_>>()
    };
    assert_eq!(usage(&a), usage(&b));
}

/// The answers to six of the example's own units (each quote narrowed
/// to the unit's sentences) on the embedded model set up by
/// `configure`, with what the job measured.
fn example_answers(
    slots: usize,
    configure: impl Fn(&mut EmbeddedModel),
) -> (Vec<(String, String)>, fanfold_llama::JobStats) {
    let plan = fanfold_engine::Plan::load(&super::repo().join("examples/issue-triage/spec.toml"))
        .expect("the example loads");
    // The stage the embedded model answers in the main job.
    let stage = plan.map_stage("auth_blocker").expect("a map stage");
    let source = plan.default_source().expect("an input");
    let routed = fanfold_engine::run::route_source(
        &plan,
        &source,
        fanfold_ops::partition::DEFAULT_MAX_UNIT_BYTES,
    )
    .expect("routes");
    let projector = fanfold_ops::view::Projector::compile(
        stage.name(),
        stage.spec.project.as_deref(),
        &stage.spec.fields,
    )
    .expect("projects");
    let requests: Vec<Request> = routed.by_stage[plan.first_stage()]
        .iter()
        .take(6)
        .enumerate()
        .map(|(index, &i)| {
            let id = routed.table.id(i).expect("a routed unit");
            let projected = projector
                .project(id.as_str(), &routed.table.value(i))
                .expect("projects");
            Request {
                index,
                unit_id: format!("u{index}"),
                suffix: stage.suffix(id.as_str(), &projected),
                schema: stage.schema_for_unit(&projected),
                input: projected,
                attempt: 1,
                max_output_tokens: stage.spec.max_output_tokens,
            }
        })
        .collect();
    assert_eq!(requests.len(), 6);
    let decision = fanfold_model::DecisionField {
        key: "decision".into(),
        choices: vec!["blocker".into(), "not_blocker".into(), "unsure".into()],
    };
    let mut m = model(true);
    configure(&mut m);
    let job = QueueJob::new(stage.prefix(), requests, slots)
        .with_schema(stage.schema.clone())
        .with_decision(decision);
    let stats = m.run_job(&job).expect("runs");
    let (done, _) = results(&job);
    let texts = done.into_iter().map(|(id, c)| (id, c.text)).collect();
    (texts, stats)
}

/// Drafting changes how many decode steps an answer takes, not the
/// choices: on the example's own units the drafted and undrafted runs
/// write the same bytes. (Batch shapes round differently, so on other
/// units a near tie may fall the other way; `bench fabric` counts how
/// often.)
#[test]
fn drafted_answers_are_the_greedy_answers() {
    let (plain, plain_stats) = example_answers(2, |m| m.set_draft_tokens(0));
    let (drafted, stats) = example_answers(2, |m| m.set_draft_tokens(8));
    assert_eq!(plain_stats.drafted, 0);
    assert!(stats.accepted > 0, "{stats:?}");
    assert!(
        stats.decode_calls < plain_stats.decode_calls,
        "{stats:?} vs {plain_stats:?}"
    );
    assert_eq!(drafted, plain);
}

/// Jump-forward takes the text the grammar forces in one batch and
/// finishes an answer whose rest is forced: fewer decode steps, the
/// bytes of decoding one step at a time. llama.cpp's CPU kernels round
/// differently in batches of other shapes, so a near tie between two
/// allowed tokens can fall either way under any change of schedule:
/// units whose step-by-step answer changes with the slot count alone
/// are such ties, and are left out of the comparison.
#[test]
fn jumping_over_forced_text_writes_the_stepwise_answers() {
    let (stepwise, step_stats) = example_answers(1, |m| m.set_jump_forward(false));
    let (two_slots, _) = example_answers(2, |m| m.set_jump_forward(false));
    let (jumped, stats) = example_answers(1, |m| m.set_jump_forward(true));
    assert_eq!(step_stats.forced, 0);
    assert_eq!(step_stats.ended_early, 0);
    assert!(stats.forced_accepted > 0, "{stats:?}");
    assert!(stats.forced_accepted <= stats.forced, "{stats:?}");
    assert!(stats.jumped > 0, "{stats:?}");
    // An answer that closes its JSON ends in forced text (one cut off
    // by its token budget does not).
    let closed = jumped
        .iter()
        .filter(|(_, t)| serde_json::from_str::<Value>(t).is_ok())
        .count() as u64;
    assert!(closed > 0, "{jumped:?}");
    assert_eq!(stats.ended_early, closed, "{stats:?}");
    assert!(
        stats.decode_calls < step_stats.decode_calls,
        "{stats:?} vs {step_stats:?}"
    );
    let stable: Vec<&(String, String)> =
        stepwise.iter().filter(|a| two_slots.contains(a)).collect();
    assert!(stable.len() >= 3, "{stepwise:?} vs {two_slots:?}");
    for answer in stable {
        assert!(jumped.contains(answer), "{answer:?} not in {jumped:?}");
    }
}

#[test]
fn units_not_handed_out_are_never_run() {
    let job = log_job(&LINES, 2, 2);
    model(true).run(&job).expect("runs");
    let (done, _) = results(&job);
    assert_eq!(done.len(), 2);
}
