//! The store on a real PostgreSQL server (a throwaway cluster per test):
//! the same operations as on SQLite, with several connections at once.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::path::{Path, PathBuf};

use fanfold_core::{
    ByteRange, ContentHash, Cost, FACT_SCHEMA, FactRecord, ModelParams, Status, Unit, UnitId,
};
use fanfold_store::{
    ChunkRef, Claim, ClaimOrFact, EffectState, Label, PartitionBatch, PartitionCounts,
    RejectionRow, RunUnitRow, Store, StoreError,
};
use fanfold_testkit::Postgres;
use serde_json::json;

fn server() -> Postgres {
    match Postgres::start() {
        Ok(pg) => pg,
        Err(e) => panic!("a PostgreSQL server for this test: {e}"),
    }
}

fn database(pg: &Postgres) -> PathBuf {
    PathBuf::from(pg.create_database().expect("createdb"))
}

fn open(url: &Path) -> Store {
    Store::open(url).unwrap_or_else(|e| panic!("open {}: {e}", url.display()))
}

fn fact(name: &str, status: Status) -> FactRecord {
    FactRecord {
        schema: FACT_SCHEMA.into(),
        key: ContentHash::of_bytes(name.as_bytes()),
        source_ids: vec![UnitId(name.into())],
        source_hashes: vec![ContentHash::of_bytes(b"u")],
        stage: "s".into(),
        stage_version: 1,
        rubric_hash: ContentHash::of_bytes(b"r"),
        model: ModelParams {
            backend: "scripted".into(),
            model_id: "m".into(),
            temperature: 0.0,
            max_output_tokens: 8,
            seed: 0,
            simulated: true,
        },
        status,
        decision: None,
        facts: serde_json::Value::Null,
        confidence: None,
        choice_scores: Vec::new(),
        reason: None,
        evidence: vec![],
        cost: Cost::default(),
        attempts: 1,
        reducer_path: vec![],
        truncated_tokens: 0,
        digest: None,
    }
}

#[test]
fn every_table_round_trips_on_postgres() {
    let pg = server();
    let url = database(&pg);
    let store = open(&url);
    assert!(store.is_shared());

    // Sources: chunks by hash, an artifact as its chunk list.
    let bytes = b"{\"id\":1}\n{\"id\":2}\n".as_slice();
    let chunk = ContentHash::of_bytes(bytes);
    store.put_chunks(&[(chunk, bytes)]).expect("chunks");
    store.put_chunks(&[(chunk, bytes)]).expect("chunks again");
    assert!(store.has_chunk(&chunk).expect("has"));
    assert_eq!(store.get_chunk(&chunk).expect("get"), Some(bytes.to_vec()));
    let source = ContentHash::of_bytes(b"source");
    let refs = [ChunkRef {
        hash: chunk,
        len: bytes.len() as u64,
        newlines: 2,
    }];
    assert!(
        store
            .put_artifact(&source, "input.jsonl", &refs)
            .expect("artifact")
    );
    assert!(
        !store
            .put_artifact(&source, "input.jsonl", &refs)
            .expect("again")
    );
    assert_eq!(
        store.artifact_chunks(&source).expect("chunks"),
        Some(refs.to_vec())
    );

    // Partitions, units, rejections and routes.
    let (part, counts) = store
        .open_partition(&ContentHash::of_bytes(b"p"), &source, "{}")
        .expect("partition");
    assert_eq!(counts, None);
    let prefilter = store
        .open_prefilter(&ContentHash::of_bytes(b"rules"), "[]")
        .expect("prefilter");
    let units = [Unit {
        unit_id: UnitId("1".into()),
        unit_kind: "record".into(),
        ordinal: 0,
        source_hash: source,
        unit_hash: ContentHash::of_bytes(b"u1"),
        bytes: ByteRange { start: 0, end: 9 },
    }];
    let rejections = [RejectionRow {
        ordinal: 1,
        reason: "missing_key".into(),
        detail: "no id".into(),
        byte_start: 9,
        byte_end: 18,
    }];
    let batch = PartitionBatch {
        partition: part,
        units: &units,
        rejections: &rejections,
        prefilter: Some(prefilter),
        first_ordinal: 0,
        rules: &[0xFE, 0xFF],
    };
    store.put_partition_batch(&batch).expect("batch");
    store.put_partition_batch(&batch).expect("batch again");
    let done = PartitionCounts {
        elements: 2,
        units: 1,
        rejected: 1,
    };
    store.finish_partition(part, done).expect("finish");
    store.finish_routing(part, prefilter).expect("routing");
    assert_eq!(
        store
            .open_partition(&ContentHash::of_bytes(b"p"), &source, "{}")
            .expect("again"),
        (part, Some(done))
    );
    assert_eq!(store.unit_range(part, "1").expect("range"), Some((0, 9)));
    assert!(store.unit_id_before(part, "1", 1).expect("before"));
    assert!(!store.unit_id_before(part, "1", 0).expect("before"));
    assert_eq!(
        store.route_of(part, prefilter, 1).expect("route"),
        Some(0xFF)
    );
    assert!(store.routing_done(part, prefilter).expect("done"));
    assert_eq!(store.count_units(&source).expect("units"), 1);

    // Facts are sealed, replaced by key, and failures never cached.
    let positive = fact("a", Status::Positive);
    store.put_fact(&positive).expect("fact");
    store.put_fact(&positive).expect("fact again");
    assert_eq!(
        store
            .get_fact(&positive.key)
            .expect("get")
            .map(|f| f.status),
        Some(Status::Positive)
    );
    assert!(matches!(
        store.put_fact(&fact("b", Status::Error)),
        Err(StoreError::NotCacheable { .. })
    ));
    assert_eq!(store.count_facts().expect("count"), 1);
    // Many keys are read in a few statements, found or not.
    let many: Vec<FactRecord> = (0..200)
        .map(|i| fact(&format!("many-{i}"), Status::Negative))
        .collect();
    for f in &many {
        store.put_fact(f).expect("fact");
    }
    let mut keys: Vec<ContentHash> = many.iter().map(|f| f.key).collect();
    keys.extend((0..100).map(|i| ContentHash::of_bytes(format!("absent-{i}").as_bytes())));
    let found = store.get_facts(&keys).expect("facts");
    assert_eq!(found.len(), 200);
    assert!(
        many.iter()
            .all(|f| found.get(&f.key).map(|g| g.status) == Some(Status::Negative))
    );
    assert_eq!(store.count_facts().expect("count"), 201);

    // Labels, embeddings (bit for bit) and fold nodes.
    let label = Label {
        key: ContentHash::of_bytes(b"l"),
        stage: "s".into(),
        unit_id: "1".into(),
        decision: "positive".into(),
        labeller: "person:ana".into(),
    };
    store.put_label(&label).expect("label");
    let relabel = Label {
        decision: "negative".into(),
        ..label.clone()
    };
    store.put_label(&relabel).expect("relabel");
    assert_eq!(store.get_label(&label.key).expect("get"), Some(relabel));
    assert!(store.delete_label(&label.key).expect("delete"));
    let v = [0.1f32, -2.5, f32::MIN_POSITIVE];
    let ek = ContentHash::of_bytes(b"e");
    store.put_embeddings("m", &[(ek, &v)]).expect("embed");
    assert_eq!(store.get_embedding(&ek).expect("get"), Some(v.to_vec()));
    store.put_fold_node(&ek, 2, &json!({"n": 3})).expect("fold");
    assert_eq!(
        store.get_fold_node(&ek).expect("fold"),
        Some(json!({"n": 3}))
    );

    // A run: begun, its units and events, then finished.
    store
        .begin_run("run-1", "triage", &ContentHash::of_bytes(b"spec"), &source)
        .expect("run");
    store
        .set_run_routing("run-1", part, prefilter)
        .expect("routing");
    store
        .put_run_units(
            "run-1",
            &[RunUnitRow {
                unit_id: "1".into(),
                stage: "s".into(),
                status: "positive".into(),
                reason: None,
                fact_key: Some(positive.key),
            }],
        )
        .expect("units");
    store.event("run-1", "started", &json!({})).expect("event");
    store.event("run-1", "stopped", &json!({})).expect("event");
    store
        .heartbeat("run-1", 60_000, Some("{\"done\":1}"))
        .expect("beat");
    assert_eq!(store.unfinished_runs().expect("runs"), ["run-1"]);
    assert_eq!(store.live_runs(60_000).expect("live").len(), 1);
    let certificate = json!({
        "statuses": {"positive": 1},
        "stats": {"model_calls": 1, "cost": {"prompt_tokens": 10, "completion_tokens": 2}}
    });
    store
        .finish_run("run-1", "completed", &certificate.to_string())
        .expect("finish");
    let runs = store.run_overview(10).expect("overview");
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].stop_reason.as_deref(), Some("completed"));
    assert_eq!(runs[0].model_calls, Some(1));
    assert_eq!(runs[0].tokens, Some(12));
    assert_eq!(runs[0].progress.as_deref(), Some("{\"done\":1}"));

    // Garbage: a failed run's source goes with it.
    let other = ContentHash::of_bytes(b"other source");
    store.put_artifact(&other, "x", &[]).expect("artifact");
    store
        .begin_run("run-2", "triage", &ContentHash::of_bytes(b"spec"), &other)
        .expect("run");
    store.fail_run("run-2", true).expect("fail");
    assert_eq!(store.count_sources().expect("sources"), 1);
    let gc = store.collect_garbage().expect("gc");
    assert_eq!(gc.sources, 0);
    assert!(gc.bytes_after > 0, "the database's size is reported");

    // Everything is there for another connection.
    drop(store);
    let again = open(&url);
    assert_eq!(again.count_facts().expect("facts"), 201);
    assert_eq!(again.count_embeddings().expect("vectors"), 1);
    assert_eq!(again.run_overview(10).expect("runs").len(), 1);
}

/// `f` on every store, each on its own thread, all let go at one instant;
/// the outcomes in the stores' order.
fn at_once<T: Send>(stores: &[Store], f: impl Fn(usize, &Store) -> T + Sync) -> Vec<T> {
    let gate = std::sync::Barrier::new(stores.len());
    std::thread::scope(|s| {
        let handles: Vec<_> = stores
            .iter()
            .enumerate()
            .map(|(i, store)| {
                let (gate, f) = (&gate, &f);
                s.spawn(move || {
                    gate.wait();
                    f(i, store)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    })
}

#[test]
fn a_key_is_claimed_by_one_connection_and_effects_need_its_lease() {
    let pg = server();
    let url = database(&pg);
    let stores: Vec<Store> = (0..4).map(|_| open(&url)).collect();
    let key = ContentHash::of_bytes(b"k");
    // Four connections claim one key at the same instant: one wins.
    let outcomes = at_once(&stores, |i, store| {
        store
            .claim(&key, &format!("run-{i}"), 60_000)
            .expect("claim")
    });
    let winners = outcomes.iter().filter(|c| **c == Claim::Mine).count();
    assert_eq!(winners, 1, "{outcomes:?}");

    // The same race through the statement that also reads the fact: a
    // claim committed while another waited on the row is not in that
    // one's snapshot, and must still count as held.
    for round in 0..20 {
        let raced = ContentHash::of_bytes(format!("raced-{round}").as_bytes());
        let outcomes = at_once(&stores, |i, store| {
            store
                .claim_or_fact(&raced, &format!("run-{i}"), 60_000)
                .expect("claim")
        });
        let won = outcomes
            .iter()
            .filter(|c| **c == ClaimOrFact::Claim(Claim::Mine))
            .count();
        assert_eq!(won, 1, "round {round}: {outcomes:?}");
    }

    // A claim and the fact under its key in one statement: the key is
    // held until its fact is written, then the fact is taken by anyone.
    let other = ContentHash::of_bytes(b"other");
    let f = fact("other", Status::Positive);
    assert_eq!(
        stores[0]
            .claim_or_fact(&other, "run-x", 60_000)
            .expect("claim"),
        ClaimOrFact::Claim(Claim::Mine)
    );
    match stores[1]
        .claim_or_fact(&other, "run-y", 60_000)
        .expect("claim")
    {
        ClaimOrFact::Claim(Claim::Held { run_id, .. }) => assert_eq!(run_id, "run-x"),
        found => panic!("held by run-x, not {found:?}"),
    }
    stores[0].put_fact(&f).expect("put");
    match stores[1]
        .claim_or_fact(&other, "run-y", 60_000)
        .expect("claim")
    {
        ClaimOrFact::Fact(got) => assert_eq!(got.key, other),
        found => panic!("the fact, not {found:?}"),
    }

    // A lease that lapsed is taken over; the late holder's effect steps
    // are refused.
    let hex = key.to_hex();
    stores[0]
        .effect_intent(&hex, "label", "7", &json!({"url": "u"}), "run-a")
        .expect("intent");
    stores[0].release_claim(&key, "run-0").expect("release");
    stores[1].release_claim(&key, "run-1").expect("release");
    stores[2].release_claim(&key, "run-2").expect("release");
    stores[3].release_claim(&key, "run-3").expect("release");
    assert_eq!(
        stores[0].claim(&key, "run-a", 1).expect("claim"),
        Claim::Mine
    );
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert_eq!(
        stores[1].claim(&key, "run-b", 60_000).expect("claim"),
        Claim::Mine
    );
    assert!(
        !stores[0]
            .effect_step(&hex, "run-a", EffectState::Dispatched, &json!({}))
            .expect("step"),
        "a lapsed lease writes nothing"
    );
    assert!(
        stores[1]
            .effect_step(&hex, "run-b", EffectState::Dispatched, &json!({"send": 1}))
            .expect("step")
    );
    let row = stores[2].effect(&hex).expect("row").expect("known");
    assert_eq!((row.state, row.sends), (EffectState::Dispatched, 1));
    assert_eq!(stores[3].effect_journal(&hex).expect("journal").len(), 2);
    assert_eq!(
        stores[3].effect_counts("label").expect("counts")["dispatched"],
        1
    );
}

#[test]
fn databases_of_other_schemas_are_refused_and_new_ones_open_for_all() {
    let pg = server();
    // Eight processes' worth of connections open one new database at once:
    // each finds the tables declared once.
    let url = database(&pg);
    let gate = std::sync::Barrier::new(8);
    std::thread::scope(|s| {
        for _ in 0..8 {
            let (gate, url) = (&gate, &url);
            s.spawn(move || {
                gate.wait();
                drop(open(url));
            });
        }
    });

    // A newer schema is refused, naming it.
    let newer = database(&pg);
    drop(open(&newer));
    let admin = postgres_client(&newer);
    admin
        .lock()
        .expect("lock")
        .batch_execute("UPDATE meta SET value = 'fanfold-store-v99' WHERE key = 'schema'")
        .expect("edit");
    let err = Store::open(&newer).err().expect("refused");
    assert!(matches!(err, StoreError::Version { .. }), "{err}");
    assert!(err.to_string().contains("fanfold-store-v99"), "{err}");

    // Another application's `meta` table is left alone.
    let foreign = database(&pg);
    postgres_client(&foreign)
        .lock()
        .expect("lock")
        .batch_execute("CREATE TABLE meta (key TEXT, value TEXT)")
        .expect("create");
    let err = Store::open(&foreign).err().expect("refused");
    assert!(matches!(err, StoreError::Foreign { .. }), "{err}");

    // A server that is not there is named, without the password.
    let gone = format!(
        "postgres://fanfold:secret@127.0.0.1:{}/none",
        pg.port().wrapping_add(1)
    );
    let err = Store::open(Path::new(&gone)).err().expect("refused");
    let text = err.to_string();
    assert!(text.contains("fanfold:***@127.0.0.1"), "{text}");
    assert!(!text.contains("secret"), "{text}");
}

fn postgres_client(url: &Path) -> std::sync::Mutex<postgres::Client> {
    let url = url.to_str().expect("utf-8");
    std::sync::Mutex::new(postgres::Client::connect(url, postgres::NoTls).expect("connect"))
}

#[test]
fn a_restarted_server_is_reconnected_to_and_nothing_is_lost() {
    let pg = server();
    let url = database(&pg);
    let store = open(&url);
    let before = fact("before", Status::Positive);
    store.put_fact(&before).expect("fact");
    pg.restart().expect("restart");
    // A statement on its own, then a transaction, each on a new connection.
    assert_eq!(
        store
            .get_fact(&before.key)
            .expect("after a restart")
            .map(|f| f.status),
        Some(Status::Positive)
    );
    pg.restart().expect("restart");
    let bytes = b"chunk".as_slice();
    store
        .put_chunks(&[(ContentHash::of_bytes(bytes), bytes)])
        .expect("a transaction after a restart");
    let after = fact("after", Status::Negative);
    store.put_fact(&after).expect("fact");
    assert_eq!(store.count_facts().expect("count"), 2);
}

/// TLS as libpq users ask for it: `sslmode=require` with the server's CA in
/// `sslrootcert` speaks TLS; a server whose certificate no trusted root
/// signed is refused, never used unverified; without `sslmode` the
/// connection stays plain.
#[test]
fn tls_is_spoken_when_asked_and_the_server_is_verified() {
    let pg = Postgres::start_tls().unwrap_or_else(|e| panic!("a TLS server: {e}"));
    let url = pg.create_database().expect("createdb");
    let ca = pg.ca_file();

    let verified = format!("{url}?sslmode=verify-full&sslrootcert={}", ca.display());
    let store = open(Path::new(&verified));
    assert!(store.encrypted().expect("asked"), "TLS with its CA");
    store
        .register_worker("w", 1, None)
        .expect("a write over TLS");

    let plain = open(Path::new(&url));
    assert!(!plain.encrypted().expect("asked"), "plain without sslmode");

    let untrusted = format!("{url}?sslmode=require");
    match Store::open(Path::new(&untrusted)) {
        Ok(_) => panic!("a certificate no trusted root signed was accepted"),
        Err(e) => assert!(e.to_string().to_lowercase().contains("certificate"), "{e}"),
    }
    let missing = format!("{url}?sslmode=require&sslrootcert=/nonexistent/ca.pem");
    let e = Store::open(Path::new(&missing)).err().expect("refused");
    assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
    let wrong = format!("{url}?sslmode=sometimes");
    let e = Store::open(Path::new(&wrong)).err().expect("refused");
    assert!(e.to_string().contains("sslmode=sometimes"), "{e}");
}

/// Keys claimed many at a time: four connections claim overlapping sets
/// of keys at one instant, each listing them in another order, and every
/// key is won once, with no deadlock; a key whose fact is stored comes
/// back as the fact. Facts written together stand as written one by one:
/// the first under a key stands. A beat drops the leases on keys whose
/// facts are stored and keeps the rest.
#[test]
fn keys_are_claimed_many_at_a_time_once_each_and_facts_written_together() {
    let pg = server();
    let url = database(&pg);
    let stores: Vec<Store> = (0..4).map(|_| open(&url)).collect();
    for round in 0..10 {
        let keys: Vec<ContentHash> = (0..40)
            .map(|k| ContentHash::of_bytes(format!("many-{round}-{k}").as_bytes()))
            .collect();
        let outcomes = at_once(&stores, |i, store| {
            // Each connection asks for 30 of the 40, starting elsewhere,
            // in its own order (a stride prime to 40: no key twice).
            let stride = [1, 3, 7, 9][i];
            let mine: Vec<ContentHash> =
                (0..30).map(|j| keys[(i * 10 + j * stride) % 40]).collect();
            let got = store
                .claim_or_fact_many(&mine, &format!("run-{i}"), 60_000)
                .expect("claim many");
            assert_eq!(got.len(), mine.len());
            mine.into_iter().zip(got).collect::<Vec<_>>()
        });
        for key in &keys {
            let won = outcomes
                .iter()
                .flatten()
                .filter(|(k, c)| k == key && *c == ClaimOrFact::Claim(Claim::Mine))
                .count();
            let asked = outcomes.iter().flatten().filter(|(k, _)| k == key).count();
            assert_eq!(
                won,
                usize::from(asked > 0),
                "round {round}: {key:?} won {won} times"
            );
        }
    }

    let facts: Vec<FactRecord> = (0..300)
        .map(|i| fact(&format!("batched-{i}"), Status::Positive))
        .collect();
    let first = fact("batched-7", Status::Negative);
    stores[0].put_fact(&first).expect("put one");
    stores[1].put_facts(&facts).expect("put together");
    assert!(matches!(
        stores[1].put_facts(&[fact("x", Status::Error)]),
        Err(StoreError::NotCacheable { .. })
    ));
    let keys: Vec<ContentHash> = facts.iter().map(|f| f.key).collect();
    let stored = stores[2].get_facts(&keys).expect("read back");
    assert_eq!(stored.len(), 300);
    assert_eq!(
        stored[&first.key].status,
        Status::Negative,
        "the first stands"
    );
    assert_eq!(stored[&keys[8]].status, Status::Positive);

    // A key with a stored fact comes back as the fact; the others are
    // claimed.
    let fresh = ContentHash::of_bytes(b"not decided");
    let got = stores[3]
        .claim_or_fact_many(&[keys[3], fresh], "run-z", 60_000)
        .expect("claim");
    assert!(
        matches!(&got[0], ClaimOrFact::Fact(f) if f.key == keys[3]),
        "{got:?}"
    );
    assert_eq!(got[1], ClaimOrFact::Claim(Claim::Mine));
    // The beat drops the lease on the decided key, keeps the other.
    let h = ContentHash::of_bytes(b"spec");
    stores[3].begin_run("run-z", "spec", &h, &h).expect("run");
    stores[3].heartbeat("run-z", 60_000, None).expect("beat");
    let leases = |s: &Store| {
        s.run_overview(10)
            .expect("runs")
            .iter()
            .find(|r| r.run_id == "run-z")
            .map(|r| r.leases)
    };
    assert_eq!(leases(&stores[0]), Some(1));
    match stores[0]
        .claim_or_fact(&fresh, "run-y", 60_000)
        .expect("claim")
    {
        ClaimOrFact::Claim(Claim::Held { run_id, .. }) => assert_eq!(run_id, "run-z"),
        found => panic!("held by run-z, not {found:?}"),
    }
}

/// The coordinator's read of a job's results: the handled tasks are
/// removed and the others read, from the oldest still waited for, in one
/// statement; a read made again after a lost answer loses nothing.
#[test]
fn a_coordinator_reads_results_and_removes_the_handled_in_one_statement() {
    let pg = server();
    let url = database(&pg);
    let (coordinator, worker) = (open(&url), open(&url));
    let h = ContentHash::of_bytes(b"spec");
    coordinator.begin_run("r", "spec", &h, &h).expect("run");
    let job = fanfold_store::FleetJob {
        job_id: "r/0".into(),
        run_id: "r".into(),
        backend: "{}".into(),
        model_id: "m".into(),
        prefix: "p".into(),
        options: "{}".into(),
    };
    coordinator.open_fleet_job(&job).expect("job");
    let tasks: Vec<(u64, String)> = (0..10).map(|i| (i, format!("req{i}"))).collect();
    coordinator.put_fleet_tasks("r/0", &tasks).expect("put");
    let claimed = worker
        .claim_fleet_tasks("r/0", "w", 10, 60_000)
        .expect("claim");
    assert_eq!(claimed.len(), 10);
    for seq in [1, 2, 5, 8] {
        assert!(
            worker
                .finish_fleet_task("r/0", seq, "w", &format!("res{seq}"))
                .expect("fin")
        );
    }
    let read = coordinator.next_fleet_results("r/0", &[], 0).expect("read");
    assert_eq!(
        read.results.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        [1, 2, 5, 8]
    );
    assert_eq!(read.unclaimed, 0, "the worker claimed all ten");
    worker
        .give_back_fleet_tasks("r/0", "w", &[3, 4])
        .expect("give back");
    // From task 2 on: task 1 is not waited for any more.
    let read = coordinator.next_fleet_results("r/0", &[], 2).expect("read");
    assert_eq!(
        read.results.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        [2, 5, 8]
    );
    assert_eq!(read.unclaimed, 2, "two given back, waiting");
    // 2 and 5 handled: removed, and not read again; the same read made
    // twice (its answer lost) reads the same.
    for _ in 0..2 {
        let read = coordinator
            .next_fleet_results("r/0", &[2, 5], 2)
            .expect("read");
        assert_eq!(read.results, [(8, "res8".to_owned())]);
        assert_eq!(read.unclaimed, 2);
    }
    let left = coordinator.fleet_results("r/0").expect("results");
    assert_eq!(left.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [1, 8]);
    // A late answer to a removed task changes nothing.
    assert!(
        !worker
            .finish_fleet_task("r/0", 2, "w", "late")
            .expect("late")
    );
}
