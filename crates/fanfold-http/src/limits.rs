//! Rate budgets and the provider headers that adjust them.
//!
//! A budget is a token bucket refilled continuously at the per-minute rate
//! and holding at most one second's worth (at least one unit). Providers
//! enforce per-minute limits over short windows ("60,000 per minute" may
//! mean "1,000 per second"), so a bucket that could hold a full minute
//! would burst into 429s. A cost larger than the bucket is admitted when
//! the bucket is full and drives it negative, so the long-run rate still
//! holds.

use std::time::{Duration, Instant};

use reqwest::header::HeaderMap;

/// The longest any wait here may be. Durations come from providers'
/// headers and from their usage figures; a hostile or broken value must
/// neither overflow a clock nor park a run for days.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);

/// Seconds to a duration, refusing what is not a finite non-negative
/// number and capping at [`MAX_WAIT`].
pub(crate) fn secs(s: f64) -> Option<Duration> {
    if !(s.is_finite() && s >= 0.0) {
        return None;
    }
    Some(Duration::try_from_secs_f64(s).map_or(MAX_WAIT, |d| d.min(MAX_WAIT)))
}

/// `now + d`, capped at [`MAX_WAIT`] so it cannot overflow.
pub(crate) fn later(now: Instant, d: Duration) -> Instant {
    let d = d.min(MAX_WAIT);
    now.checked_add(d).unwrap_or(now)
}

#[derive(Clone, Debug)]
pub(crate) struct Bucket {
    capacity: f64,
    per_sec: f64,
    level: f64,
    updated: Instant,
}

impl Bucket {
    /// `None` for a zero limit, which cannot be a budget.
    pub(crate) fn per_minute(limit: u64, now: Instant) -> Option<Bucket> {
        if limit == 0 {
            return None;
        }
        let per_sec = limit as f64 / 60.0;
        let capacity = per_sec.ceil().max(1.0);
        Some(Bucket {
            capacity,
            per_sec,
            level: capacity,
            updated: now,
        })
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.updated).as_secs_f64();
        self.level = (self.level + dt * self.per_sec).min(self.capacity);
        self.updated = self.updated.max(now);
    }

    /// How long until `cost` may be taken; zero means now.
    pub(crate) fn wait_for(&mut self, cost: f64, now: Instant) -> Duration {
        self.refill(now);
        let need = cost.min(self.capacity);
        if self.level >= need {
            Duration::ZERO
        } else {
            // Never zero while short, so a caller's wait loop makes progress.
            secs(((need - self.level) / self.per_sec).max(0.001)).unwrap_or(MAX_WAIT)
        }
    }

    pub(crate) fn take(&mut self, cost: f64) {
        self.level -= cost;
    }

    /// Gives back (or, when negative, charges) tokens after the fact.
    pub(crate) fn adjust(&mut self, amount: f64) {
        self.level = (self.level + amount).min(self.capacity);
    }

    /// The provider says only `remaining` are left in its window.
    pub(crate) fn cap(&mut self, remaining: f64) {
        self.level = self.level.min(remaining);
    }
}

/// One endpoint's request and token budgets, plus a hold the provider
/// imposed (`Retry-After`, or a window reported exhausted).
#[derive(Clone, Debug)]
pub(crate) struct Budget {
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
    blocked_until: Option<Instant>,
    /// The longest hold a provider may impose; past it a request is sent
    /// and meets the provider's verdict itself.
    hold_cap: Duration,
}

impl Budget {
    pub(crate) fn new(
        rpm: Option<u64>,
        tpm: Option<u64>,
        hold_cap: Duration,
        now: Instant,
    ) -> Budget {
        Budget {
            requests: rpm.and_then(|l| Bucket::per_minute(l, now)),
            tokens: tpm.and_then(|l| Bucket::per_minute(l, now)),
            blocked_until: None,
            hold_cap,
        }
    }

    /// Reserves one request and `cost` tokens, or says how long to wait.
    pub(crate) fn admit(&mut self, cost: u64, now: Instant) -> Result<(), Duration> {
        let mut wait = self
            .blocked_until
            .map(|t| t.saturating_duration_since(now))
            .unwrap_or_default();
        if let Some(b) = &mut self.requests {
            wait = wait.max(b.wait_for(1.0, now));
        }
        if let Some(b) = &mut self.tokens {
            wait = wait.max(b.wait_for(cost as f64, now));
        }
        if !wait.is_zero() {
            return Err(wait);
        }
        self.blocked_until = None;
        if let Some(b) = &mut self.requests {
            b.take(1.0);
        }
        if let Some(b) = &mut self.tokens {
            b.take(cost as f64);
        }
        Ok(())
    }

    /// Corrects a reservation with what the provider counted.
    pub(crate) fn settle(&mut self, reserved: u64, actual: u64) {
        if let Some(b) = &mut self.tokens {
            b.adjust(reserved as f64 - actual as f64);
        }
    }

    /// Holds every request to this endpoint for `d`.
    pub(crate) fn hold(&mut self, d: Duration, now: Instant) {
        let until = later(now, d.min(self.hold_cap));
        if self.blocked_until.is_none_or(|t| t < until) {
            self.blocked_until = Some(until);
        }
    }

    /// Applies the provider's view of its limits.
    pub(crate) fn observe(&mut self, info: &RateInfo, now: Instant) {
        if self.requests.is_none()
            && let Some(limit) = info.limit_requests
        {
            self.requests = Bucket::per_minute(limit, now);
        }
        if self.tokens.is_none()
            && let Some(limit) = info.limit_tokens
        {
            self.tokens = Bucket::per_minute(limit, now);
        }
        let pairs = [
            (
                &mut self.requests,
                info.remaining_requests,
                info.reset_requests,
            ),
            (&mut self.tokens, info.remaining_tokens, info.reset_tokens),
        ];
        let mut hold = None;
        for (bucket, remaining, reset) in pairs {
            match remaining {
                Some(0) => {
                    let d = reset.unwrap_or(Duration::from_secs(1));
                    hold = Some(hold.map_or(d, |h: Duration| h.max(d)));
                }
                Some(r) => {
                    if let Some(b) = bucket {
                        b.cap(r as f64);
                    }
                }
                None => {}
            }
        }
        if let Some(d) = hold {
            self.hold(d, now);
        }
    }
}

/// What a response's headers say about the provider's limits.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct RateInfo {
    pub limit_requests: Option<u64>,
    pub limit_tokens: Option<u64>,
    pub remaining_requests: Option<u64>,
    pub remaining_tokens: Option<u64>,
    pub reset_requests: Option<Duration>,
    pub reset_tokens: Option<Duration>,
    pub retry_after: Option<Duration>,
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::trim)
}

fn number(h: &HeaderMap, name: &str) -> Option<u64> {
    header(h, name).and_then(|v| v.parse().ok())
}

fn min_opt<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl RateInfo {
    /// Reads OpenAI-style `x-ratelimit-*`, Anthropic's
    /// `anthropic-ratelimit-*`, `retry-after-ms` and `retry-after`.
    pub(crate) fn from_headers(h: &HeaderMap) -> RateInfo {
        let now = jiff::Timestamp::now();
        let until = |name: &str| header(h, name).and_then(|v| until_rfc3339(v, now));
        let openai = RateInfo {
            limit_requests: number(h, "x-ratelimit-limit-requests"),
            limit_tokens: number(h, "x-ratelimit-limit-tokens"),
            remaining_requests: number(h, "x-ratelimit-remaining-requests"),
            remaining_tokens: number(h, "x-ratelimit-remaining-tokens"),
            reset_requests: header(h, "x-ratelimit-reset-requests").and_then(parse_go_duration),
            reset_tokens: header(h, "x-ratelimit-reset-tokens").and_then(parse_go_duration),
            retry_after: None,
        };
        // Anthropic's `tokens-*` is the most restrictive of its token
        // limits; fall back to the input-token limit when only that is sent.
        let anthropic = RateInfo {
            limit_requests: number(h, "anthropic-ratelimit-requests-limit"),
            limit_tokens: number(h, "anthropic-ratelimit-tokens-limit")
                .or_else(|| number(h, "anthropic-ratelimit-input-tokens-limit")),
            remaining_requests: number(h, "anthropic-ratelimit-requests-remaining"),
            remaining_tokens: number(h, "anthropic-ratelimit-tokens-remaining")
                .or_else(|| number(h, "anthropic-ratelimit-input-tokens-remaining")),
            reset_requests: until("anthropic-ratelimit-requests-reset"),
            reset_tokens: until("anthropic-ratelimit-tokens-reset")
                .or_else(|| until("anthropic-ratelimit-input-tokens-reset")),
            retry_after: None,
        };
        let retry_after = header(h, "retry-after-ms")
            .and_then(|v| v.parse::<f64>().ok())
            .and_then(|ms| secs(ms / 1000.0))
            .or_else(|| header(h, "retry-after").and_then(|v| parse_retry_after(v, now)));
        RateInfo {
            limit_requests: min_opt(openai.limit_requests, anthropic.limit_requests),
            limit_tokens: min_opt(openai.limit_tokens, anthropic.limit_tokens),
            remaining_requests: min_opt(openai.remaining_requests, anthropic.remaining_requests),
            remaining_tokens: min_opt(openai.remaining_tokens, anthropic.remaining_tokens),
            reset_requests: openai.reset_requests.or(anthropic.reset_requests),
            reset_tokens: openai.reset_tokens.or(anthropic.reset_tokens),
            retry_after,
        }
    }
}

/// `Retry-After`: delay seconds (integer, or decimal as some servers send)
/// or an HTTP date.
pub(crate) fn parse_retry_after(v: &str, now: jiff::Timestamp) -> Option<Duration> {
    if let Ok(s) = v.parse::<f64>() {
        return secs(s);
    }
    let at = jiff::fmt::rfc2822::DateTimeParser::new()
        .parse_timestamp(v)
        .ok()?;
    Some(until(at, now))
}

fn until_rfc3339(v: &str, now: jiff::Timestamp) -> Option<Duration> {
    let at: jiff::Timestamp = v.parse().ok()?;
    Some(until(at, now))
}

fn until(at: jiff::Timestamp, now: jiff::Timestamp) -> Duration {
    let ms = at.as_millisecond() - now.as_millisecond();
    Duration::from_millis(ms.max(0) as u64)
}

/// Durations as OpenAI writes them in `x-ratelimit-reset-*`: `1s`,
/// `6m0s`, `20ms`, `1h2m3.5s`.
pub(crate) fn parse_go_duration(v: &str) -> Option<Duration> {
    let mut rest = v.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0f64;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return None;
        }
        let n: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" | "" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "d" => 86_400.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += n * scale;
    }
    secs(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn bucket_admits_one_seconds_worth_then_paces() {
        let t0 = Instant::now();
        // 120 per minute: 2 per second, bucket of 2.
        let mut b = Budget::new(Some(120), None, HOUR, t0);
        assert!(b.admit(0, t0).is_ok());
        assert!(b.admit(0, t0).is_ok());
        let wait = b.admit(0, t0).unwrap_err();
        assert!(wait > Duration::from_millis(400) && wait <= Duration::from_millis(500));
        assert!(b.admit(0, t0 + Duration::from_millis(500)).is_ok());
        assert!(b.admit(0, t0 + Duration::from_millis(500)).is_err());
        // Over a simulated minute no more than the limit plus one bucket
        // goes out.
        let mut b = Budget::new(Some(120), None, HOUR, t0);
        let mut admitted = 0;
        for ms in (0..60_000).step_by(10) {
            if b.admit(0, t0 + Duration::from_millis(ms)).is_ok() {
                admitted += 1;
            }
        }
        assert!((120..=122).contains(&admitted), "{admitted}");
    }

    #[test]
    fn large_token_costs_pass_when_full_and_go_into_debt() {
        let t0 = Instant::now();
        // 600 tokens a minute: 10 a second; a 50-token request exceeds it.
        let mut b = Budget::new(None, Some(600), HOUR, t0);
        assert!(b.admit(50, t0).is_ok());
        let wait = b.admit(50, t0).unwrap_err();
        // 40 in debt, 10 needed: 50 tokens at 10 a second.
        assert!(wait >= Duration::from_millis(4900) && wait <= Duration::from_millis(5000));
        // Actual usage was 20, so 30 come back.
        b.settle(50, 20);
        let wait = b.admit(50, t0).unwrap_err();
        assert!(wait >= Duration::from_millis(1900) && wait <= Duration::from_millis(2000));
    }

    #[test]
    fn exhausted_window_holds_until_reset() {
        let t0 = Instant::now();
        let mut b = Budget::new(None, None, HOUR, t0);
        let info = RateInfo {
            remaining_requests: Some(0),
            reset_requests: Some(Duration::from_secs(2)),
            ..RateInfo::default()
        };
        b.observe(&info, t0);
        assert_eq!(b.admit(1, t0), Err(Duration::from_secs(2)));
        assert!(b.admit(1, t0 + Duration::from_secs(2)).is_ok());
        // A provider's hold never exceeds the cap, however far its reset.
        let mut b = Budget::new(None, None, Duration::from_secs(5), t0);
        let info = RateInfo {
            remaining_tokens: Some(0),
            reset_tokens: parse_go_duration("99999999999h"),
            ..RateInfo::default()
        };
        b.observe(&info, t0);
        assert_eq!(b.admit(1, t0), Err(Duration::from_secs(5)));
    }

    #[test]
    fn limits_are_learned_from_headers_when_not_configured() {
        let t0 = Instant::now();
        let mut b = Budget::new(None, None, HOUR, t0);
        let info = RateInfo {
            limit_requests: Some(60),
            remaining_requests: Some(59),
            ..RateInfo::default()
        };
        b.observe(&info, t0);
        assert!(b.admit(1, t0).is_ok());
        assert!(b.admit(1, t0).is_err());
    }

    #[test]
    fn headers_parse_in_both_dialects() {
        let mut h = HeaderMap::new();
        let mut put = |k: &'static str, v: &str| {
            h.insert(k, HeaderValue::from_str(v).expect("header value"));
        };
        put("x-ratelimit-limit-requests", "500");
        put("x-ratelimit-remaining-requests", "499");
        put("x-ratelimit-remaining-tokens", "149984");
        put("x-ratelimit-reset-requests", "120ms");
        put("x-ratelimit-reset-tokens", "6m0s");
        put("retry-after", "3");
        let info = RateInfo::from_headers(&h);
        assert_eq!(info.limit_requests, Some(500));
        assert_eq!(info.remaining_requests, Some(499));
        assert_eq!(info.remaining_tokens, Some(149_984));
        assert_eq!(info.reset_requests, Some(Duration::from_millis(120)));
        assert_eq!(info.reset_tokens, Some(Duration::from_secs(360)));
        assert_eq!(info.retry_after, Some(Duration::from_secs(3)));

        let mut h = HeaderMap::new();
        let reset = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(30);
        let mut put = |k: &'static str, v: &str| {
            h.insert(k, HeaderValue::from_str(v).expect("header value"));
        };
        put("anthropic-ratelimit-requests-remaining", "0");
        put("anthropic-ratelimit-requests-reset", &reset.to_string());
        put("anthropic-ratelimit-input-tokens-remaining", "1000");
        put("retry-after-ms", "250");
        let info = RateInfo::from_headers(&h);
        assert_eq!(info.remaining_requests, Some(0));
        let r = info.reset_requests.expect("reset parsed");
        assert!(r > Duration::from_secs(28) && r <= Duration::from_secs(30));
        assert_eq!(info.remaining_tokens, Some(1000));
        assert_eq!(info.retry_after, Some(Duration::from_millis(250)));
    }

    #[test]
    fn retry_after_accepts_seconds_and_http_dates() {
        let now: jiff::Timestamp = "2015-10-21T07:28:00Z".parse().expect("timestamp");
        assert_eq!(
            parse_retry_after("120", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_retry_after("1.5", now),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-1", now), None);
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("1s"), Some(Duration::from_secs(1)));
        assert_eq!(parse_go_duration("6m0s"), Some(Duration::from_secs(360)));
        assert_eq!(parse_go_duration("20ms"), Some(Duration::from_millis(20)));
        assert_eq!(
            parse_go_duration("1h2m3.5s"),
            Some(Duration::from_millis(3_723_500))
        );
        assert_eq!(parse_go_duration("2"), Some(Duration::from_secs(2)));
        assert_eq!(parse_go_duration("ms"), None);
        assert_eq!(parse_go_duration("3 parsecs"), None);
        assert_eq!(parse_go_duration(""), None);
    }
}
