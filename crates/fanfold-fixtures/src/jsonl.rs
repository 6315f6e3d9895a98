//! Large synthetic JSONL inputs for benchmarks.
//!
//! Benchmarks need inputs far bigger than memory should hold, so records are
//! produced one at a time into a reused buffer and written immediately;
//! nothing grows with `n`. Buffering is left to the caller because the caller
//! knows whether it writes to a file, a pipe or a hash.

use std::fmt::Write as _;
use std::io::Write;

use serde::Serialize;

use crate::rng::{Rng, splitmix64};
use crate::time::rfc3339;

const SERVICES: &[&str] = &[
    "api-gateway",
    "auth-service",
    "billing",
    "search-indexer",
    "search-query",
    "notifications",
    "export-worker",
    "scheduler",
    "web-frontend",
    "ingest",
    "reporting",
    "storage-proxy",
];

const COUNTRIES: &[&str] = &[
    "US", "DE", "GB", "FR", "JP", "IN", "BR", "CA", "AU", "NL", "SE", "CH", "ES", "IT", "PL", "KR",
    "MX", "SG", "ZA", "IE",
];

const INFO_MSGS: &[&str] = &[
    "GET /api/v3/records?page={n} completed status=200 bytes={n}",
    "POST /api/v3/records created record rec_{hex}",
    "job {hex} finished rows={n}",
    "cache refreshed for workspace ws_{n} entries={n}",
    "delivered webhook {hex} attempt=1 status=200",
    "index segment merged segments={n} docs={n}",
    "invoice INV-{n} rendered pages={n}",
    "export exp_{hex} uploaded to s3://acme-exports/{hex}.csv.gz",
];

const DEBUG_MSGS: &[&str] = &[
    "pool checkout took {n}ms idle={n} busy={n}",
    "query plan chosen: index scan on records_workspace_id_idx cost={n}",
    "feature flags evaluated for workspace ws_{n}: search_v2=on billing_v3=off",
    "retry budget remaining={n} for upstream storage-proxy",
];

const WARN_MSGS: &[&str] = &[
    "slow upstream response from storage-proxy after {n}ms",
    "rate limit at {n}% of quota for workspace ws_{n}",
    "retrying webhook {hex} attempt={n} after status=503",
    "queue depth {n} above soft limit for export-worker",
    "deprecated endpoint /api/v2/records called by client {hex}",
];

const ERROR_MSGS: &[&str] = &[
    "upstream storage-proxy returned 502 after {n}ms",
    "failed to parse payload: expected value at line 1 column {n}",
    "deadline exceeded for job {hex} after {n}ms",
    "database error: could not serialize access due to concurrent update (record rec_{hex})",
    "panic in handler: index out of bounds: the len is {n} but the index is {n}",
    "webhook {hex} permanently failed after {n} attempts",
];

#[derive(Serialize)]
struct User {
    id: u64,
    country: &'static str,
}

#[derive(Serialize)]
struct Record<'a> {
    id: u64,
    ts: &'a str,
    level: &'static str,
    service: &'static str,
    latency_ms: u64,
    user: User,
    msg: &'a str,
}

/// Log-shaped records: `{"id", "ts", "level", "service", "latency_ms",
/// "user": {"id", "country"}, "msg"}`, one compact object per line, each
/// 200-400 bytes including the newline, about 5 % `ERROR`. Ids are unique and
/// increasing, timestamps non-decreasing. Returns the number of bytes written.
pub fn write_records(w: &mut impl Write, seed: u64, n: u64) -> std::io::Result<u64> {
    let mut rng = Rng::new(seed ^ 0x4A53_4F4E_4C5F_3031);
    let mut sm = seed;
    let first_id = 1_000_000 + splitmix64(&mut sm) % 1_000_000_000;
    let start_ms: i64 = 1_735_689_600_000; // 2025-01-01T00:00:00Z
    let mut t_ms = start_ms;

    let mut ts = String::with_capacity(32);
    let mut msg = String::with_capacity(320);
    let mut line: Vec<u8> = Vec::with_capacity(512);
    let mut written = 0u64;

    for i in 0..n {
        t_ms += rng.range(0, 40) as i64;
        ts.clear();
        let secs = rfc3339(t_ms.div_euclid(1000));
        // "2025-01-01T00:00:00Z" -> "2025-01-01T00:00:00.123Z"
        let _ = write!(ts, "{}.{:03}Z", &secs[..19], t_ms.rem_euclid(1000));

        let roll = rng.below(1000);
        let (level, templates) = match roll {
            0..50 => ("ERROR", ERROR_MSGS),
            50..170 => ("WARN", WARN_MSGS),
            170..270 => ("DEBUG", DEBUG_MSGS),
            _ => ("INFO", INFO_MSGS),
        };
        let latency_ms = if level == "ERROR" || rng.chance(8) {
            rng.range(200, 30_000)
        } else {
            rng.range(1, 180)
        };

        msg.clear();
        let template = rng.pick(templates);
        fill(&mut rng, &mut msg, template);
        let service = rng.pick(SERVICES);
        let user_id = rng.range(1, 250_000);
        let country = rng.pick(COUNTRIES);
        let mut record = Record {
            id: first_id.wrapping_add(i),
            ts: &ts,
            level,
            service,
            latency_ms,
            user: User {
                id: user_id,
                country,
            },
            msg: "",
        };
        // Pad with the key/value context real services append, so lines spread
        // over the promised size band. Messages never need JSON escaping, so
        // the line grows exactly as much as the message.
        line.clear();
        serde_json::to_writer(&mut line, &record).map_err(std::io::Error::other)?;
        let overhead = line.len();
        let target = rng.range(200, 340) as usize;
        while overhead + msg.len() < target {
            pad(&mut rng, &mut msg);
        }
        record.msg = &msg;
        line.clear();
        serde_json::to_writer(&mut line, &record).map_err(std::io::Error::other)?;
        line.push(b'\n');
        w.write_all(&line)?;
        written += line.len() as u64;
    }
    Ok(written)
}

fn pad(rng: &mut Rng, msg: &mut String) {
    let _ = match rng.below(4) {
        0 => write!(msg, " request_id={:016x}", rng.next_u64()),
        1 => write!(
            msg,
            " trace_id={:016x}{:016x}",
            rng.next_u64(),
            rng.next_u64()
        ),
        2 => write!(
            msg,
            " region={}",
            rng.pick(&["us-east-1", "eu-west-1", "ap-northeast-1"])
        ),
        _ => write!(
            msg,
            " attempt={} pod=worker-{}",
            rng.range(1, 5),
            rng.range(0, 63)
        ),
    };
}

fn fill(rng: &mut Rng, out: &mut String, template: &str) {
    let mut rest = template;
    while let Some(pos) = rest.find('{') {
        out.push_str(&rest[..pos]);
        let tail = &rest[pos..];
        if let Some(after) = tail.strip_prefix("{n}") {
            let _ = write!(out, "{}", rng.range(1, 99_999));
            rest = after;
        } else if let Some(after) = tail.strip_prefix("{hex}") {
            let _ = write!(out, "{:08x}", rng.next_u64() as u32);
            rest = after;
        } else {
            out.push('{');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_parses_with_the_documented_shape() -> std::io::Result<()> {
        let mut buf = Vec::new();
        let bytes = write_records(&mut buf, 42, 1)?;
        assert_eq!(bytes, buf.len() as u64);
        let line = std::str::from_utf8(&buf).map_err(std::io::Error::other)?;
        assert!(line.ends_with('\n'));
        let v: serde_json::Value = serde_json::from_str(line.trim_end())?;
        let obj = v
            .as_object()
            .ok_or_else(|| std::io::Error::other("not an object"))?;
        let keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            ["id", "latency_ms", "level", "msg", "service", "ts", "user"]
        );
        assert!(v["id"].is_u64());
        assert!(v["latency_ms"].is_u64());
        assert!(v["user"]["id"].is_u64());
        assert!(v["user"]["country"].is_string());
        assert!(["INFO", "WARN", "ERROR", "DEBUG"].contains(&v["level"].as_str().unwrap_or("")));
        assert_eq!(v["ts"].as_str().map(str::len), Some(24));
        Ok(())
    }

    #[test]
    fn thousand_lines_are_unique_sized_and_deterministic() -> std::io::Result<()> {
        let mut a = Vec::new();
        let mut b = Vec::new();
        let bytes = write_records(&mut a, 9, 1_000)?;
        write_records(&mut b, 9, 1_000)?;
        assert_eq!(a, b);
        assert_eq!(bytes, a.len() as u64);
        let text = String::from_utf8(a).map_err(std::io::Error::other)?;
        let mut ids = std::collections::BTreeSet::new();
        let mut errors = 0;
        let mut last_ts = String::new();
        for line in text.lines() {
            assert!(
                (199..=399).contains(&line.len()),
                "line of {} bytes: {line}",
                line.len()
            );
            let v: serde_json::Value = serde_json::from_str(line)?;
            assert!(ids.insert(v["id"].as_u64()));
            if v["level"] == "ERROR" {
                errors += 1;
            }
            let ts = v["ts"].as_str().unwrap_or("").to_string();
            assert!(ts >= last_ts);
            last_ts = ts;
        }
        assert_eq!(ids.len(), 1_000);
        assert!((25..=80).contains(&errors), "{errors} errors");
        Ok(())
    }

    #[test]
    fn different_seeds_differ() -> std::io::Result<()> {
        let mut a = Vec::new();
        let mut b = Vec::new();
        write_records(&mut a, 1, 10)?;
        write_records(&mut b, 2, 10)?;
        assert_ne!(a, b);
        Ok(())
    }
}
